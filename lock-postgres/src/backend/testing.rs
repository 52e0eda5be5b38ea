//! Views of a backend's internals for this crate's tests (hidden from the
//! docs, not part of the API): how many of its `acquire` calls wait, how
//! many wait for a wake-up, the advisory-lock key a name's waiters queue
//! on, and the NOTIFY channel.

use std::sync::atomic::Ordering;

use lockcore::LockName;

use crate::PostgresBackend;
use crate::keys;

/// Waiting `acquire` calls of `backend` (in its local line, at the
/// turnstile, or waiting for the lease).
pub fn waiting(backend: &PostgresBackend) -> usize {
    backend.inner.waiting.load(Ordering::Relaxed)
}

/// Waiters of `backend` registered for a store wake-up (of any lock,
/// semaphore or reader-writer lock), between their attempts.
pub fn watching(backend: &PostgresBackend) -> usize {
    backend.inner.client.wakeups.waiting()
}

/// The advisory-lock key waiters of `name` queue on (`pg_locks.objid`
/// holds its low 32 bits, `classid` its high 32 bits, `objsubid` is 1).
pub fn turnstile_key(backend: &PostgresBackend, name: &LockName) -> i64 {
    keys::turnstile_key(backend.table(), name.as_str())
}

/// The NOTIFY channel `backend`'s waiters listen on.
pub fn channel(backend: &PostgresBackend) -> &str {
    &backend.inner.client.sql.channel
}
