//! `Client`: one backend instance's link to the server, shared by its
//! clones. The round trips it makes live with the role they serve
//! (`locks.rs`, `permits.rs`, `rw.rs`, `fence/floor.rs`, `wait/`); its clean-ups and
//! its closing live beside it (`background.rs`, `closing.rs`).

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{CancellationToken, Cleanups};
use lockcore::{LockError, LockName};
use redis::FromRedisValue;
use tokio_util::task::TaskTracker;

use super::commands::Commands;
use super::script::Call;
use crate::fence::failover::Failover;
use crate::keys::{Keys, PermitKeys, RwKeys};
use crate::wait::notify::Notifier;

/// One backend instance's link to the server.
pub(crate) struct Client {
    pub(crate) commands: Commands,
    /// On a Redis Cluster, which primary serves each slot (for `renew_many`).
    pub(crate) slot_owners: super::cluster::SlotOwners,
    pub(crate) prefix: String,
    pub(crate) endpoint: String,
    /// Connect + response timeout: the longest one request may take.
    pub(crate) op_timeout: Duration,
    /// The longest a lock handed to a woken waiter of this instance stays
    /// reserved for it (at most the waiter's TTL).
    pub(crate) claim_window: Duration,
    pub(crate) notifier: Arc<Notifier>,
    /// The server's incarnations as this client saw them, and the era
    /// every lease's loss signal comes from.
    pub(crate) failover: Failover,
    /// Background clean-ups this client owes the store; `close` finishes them.
    pub(crate) cleanups: Cleanups,
    /// Cancelled when the client closes (or is dropped): the parent of every
    /// lease's loss signal, so every lease it granted is lost at once.
    pub(crate) closing: CancellationToken,
    /// The client's own background tasks (the subscription, the handling of
    /// what it hears, lease checks): each ends once `closing` fires.
    pub(crate) tasks: TaskTracker,
    /// Acquires in progress (waits, and attempts in flight): each may leave
    /// a clean-up behind when it ends, which `close` must see.
    pub(crate) acquires: TaskTracker,
}

impl Drop for Client {
    /// Nothing can renew this client's leases any more: each is lost now.
    fn drop(&mut self) {
        self.closing.cancel();
        self.notifier.shutdown();
    }
}

impl Client {
    pub(crate) fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.prefix, name)
    }

    pub(crate) fn permit_keys(&self, name: &LockName) -> PermitKeys {
        PermitKeys::new(&self.prefix, name)
    }

    pub(crate) fn rw_keys(&self, name: &LockName) -> RwKeys {
        RwKeys::new(&self.prefix, name)
    }

    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &str,
        call: &Call,
    ) -> Result<T, LockError> {
        self.commands.invoke(what, &call.1, &call.0).await
    }
}
