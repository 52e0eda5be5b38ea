//! The connection every request of one client goes through, and the work
//! tied to it, until the client is closed.
//!
//! Everything that talks to etcd (the operations, the sessions' keeper, the
//! watch stream, each queue's view, the eviction notices) reaches the etcd
//! client through here, so closing drops the client's last handle and its
//! connections close. Background work runs through here too, in two
//! tracked sets: the clean-ups the client owes the store (removing a
//! cancelled waiter's entry, revoking a session nobody uses), which closing
//! finishes first, and the tasks that follow the store (the keeper, the
//! watch stream, the views, the notices), which end at shutdown.
//!
//! Inside this role: connecting ([`connect`]: options, TLS, the checks at
//! connect in [`probe`]), the client of one backend instance ([`client`]),
//! its sessions ([`session`]) and closing ([`close`]).

pub(crate) mod client;
mod close;
mod connect;
pub(crate) mod probe;
pub(crate) mod session;

use std::future::Future;
use std::sync::RwLock;
use std::time::Duration;

use etcd_client::{Client, KvClient, LeaseClient};
use lockcore::LockError;
use lockcore::backend::{CancellationToken, Cleanups};
use tokio_util::task::TaskTracker;

use crate::error::BACKEND;

/// The most operations etcd takes in one transaction (its `--max-txn-ops`,
/// 128 unless the operator raised it): counted per branch, and a nested
/// transaction's own count against what its parent's branch leaves. A
/// transaction over it is refused whole ("too many operations in txn
/// request"), so every transaction whose size grows with a batch is cut to
/// fit.
pub(crate) const MAX_TXN_OPS: usize = 128;

/// One client's connection and background work.
pub(crate) struct Conn {
    client: RwLock<Option<Client>>,
    /// What the client owes the store: finished before it closes.
    pub(crate) cleanups: Cleanups,
    /// Tasks that follow the store: they end at shutdown.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Conn {
    pub(crate) fn new(client: Client) -> Self {
        Conn {
            client: RwLock::new(Some(client)),
            cleanups: Cleanups::new(),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
        }
    }

    /// The etcd client, while the client is open.
    pub(crate) fn get(&self) -> Result<Client, LockError> {
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(closed)
    }

    /// The KV service, while the client is open.
    pub(crate) fn kv(&self) -> Result<KvClient, LockError> {
        self.with(Client::kv_client)
    }

    /// The lease service, while the client is open.
    pub(crate) fn lease(&self) -> Result<LeaseClient, LockError> {
        self.with(Client::lease_client)
    }

    fn with<T>(&self, service: impl FnOnce(&Client) -> T) -> Result<T, LockError> {
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(service)
            .ok_or_else(closed)
    }

    /// Whether shutdown began (no new background task starts).
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Runs `task` (one that follows the store) in the background until it
    /// ends or the client shuts down. `false` without a runtime, or once
    /// shut down: nothing runs.
    pub(crate) fn spawn_task<F>(&self, task: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.is_shut_down() {
            return false;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let shutdown = self.shutdown.clone();
        self.tasks.spawn_on(
            async move {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = task => {}
                }
            },
            &runtime,
        );
        true
    }

    /// Runs a clean-up the client owes the store in the background, tracked
    /// so that closing finishes it. `false` without a runtime: what it would
    /// undo expires with its session.
    pub(crate) fn cleanup<F>(&self, work: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.cleanups.spawn(work)
    }

    /// Ends every background task and waits (at most `limit`) until they
    /// have; then drops the etcd client, whose connections close with its
    /// last handle. Returns whether every task ended in time.
    pub(crate) async fn shut_down(&self, limit: Duration) -> bool {
        self.shutdown.cancel();
        self.tasks.close();
        let ended = tokio::time::timeout(limit, self.tasks.wait()).await.is_ok();
        drop(
            self.client
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        ended
    }

    /// Shutdown without waiting (a backend dropped without `close`): every
    /// task is told to end, and the client goes with the last of them.
    pub(crate) fn abandon(&self) {
        self.shutdown.cancel();
        self.tasks.close();
    }
}

/// What every request of a closed client fails with.
pub(crate) fn closed() -> LockError {
    LockError::unavailable(BACKEND, "this etcd client was closed")
}
