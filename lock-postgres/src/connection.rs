//! Connecting and the connections statements run on: the store client of
//! one backend instance (its pool, statements, listener and clean-ups), the
//! pool itself, and what `connect` checks on the server.

mod pool;
mod probe;

use std::sync::Arc;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::CancellationToken;

pub(crate) use pool::{Checkout, Pool};
pub(crate) use probe::Facts;

use crate::locks::sql::Sql;
use crate::wait::notify::Wakeups;
use lockcore::backend::Era;

/// The pool and statements of one backend instance.
pub(crate) struct Client {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) op_timeout: Duration,
    pub(crate) wakeups: Wakeups,
    /// Background clean-ups this client owes the store; `close` finishes them.
    pub(crate) cleanups: lockcore::backend::Cleanups,
    /// Cancelled when the backend is closed (or dropped): every lease's
    /// loss signal descends from it, and waits end.
    pub(crate) closing: CancellationToken,
    /// The leases of the server timeline in use: a failover ends them.
    pub(crate) era: Arc<Era>,
    /// The intents of this client's waiting writers that may be in the
    /// store: `close` removes those left.
    pub(crate) intents: crate::rw::Intents,
}

impl Client {
    /// A connection for one operation, within the operation timeout.
    pub(crate) async fn checkout(&self, what: &'static str) -> Result<Checkout, LockError> {
        self.pool.checkout(what, self.op_timeout).await
    }
}

/// A duration as the statements take it: whole microseconds (`timestamptz`
/// resolution), if it fits.
pub(crate) fn micros(d: Duration) -> Option<i64> {
    i64::try_from(d.as_micros()).ok()
}

/// A TTL in whole microseconds, as the grant statements take it.
pub(crate) fn ttl_micros(ttl: lockcore::backend::Ttl) -> Result<i64, LockError> {
    micros(ttl.get()).ok_or_else(|| LockError::InvalidTtl {
        ttl: ttl.get(),
        reason: "does not fit PostgreSQL's interval".into(),
    })
}

/// Microseconds a statement returned, as a duration (negative: none).
pub(crate) fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}
