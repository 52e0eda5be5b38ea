//! `ZooKeeperBackend`: connecting, and the `LockBackend` contract over the
//! client's operations.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::wait::{self, WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockRequest, Polling, Ttl};
use lockcore::{
    Attempt, AttemptEach, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError,
    LockName, ReleaseOutcome,
};
use zookeeper_client as zk;

use crate::config::ZooKeeperConfig;
use crate::connection::Client;
use crate::error::BACKEND;
use crate::wait::LineWaiter;

/// A ZooKeeper lock client: one session, shared by its clones.
///
/// See the crate documentation for the recipe and what it guarantees.
#[derive(Clone)]
pub struct ZooKeeperBackend {
    client: Arc<Client>,
}

impl ZooKeeperBackend {
    /// Connects with a `zk://` URL or a plain connect string (see
    /// [`ZooKeeperConfig::from_url`]).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL; [`LockError::Unavailable`]
    /// when no server answers; [`LockError::Store`] when the lock root cannot
    /// be created (an ACL of another identity).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(ZooKeeperConfig::from_url(url)?).await
    }

    /// Connects with `config`: opens a session and creates the lock root if
    /// it is missing.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: ZooKeeperConfig) -> Result<Self, LockError> {
        Ok(ZooKeeperBackend {
            client: Client::open(config).await?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ZooKeeperConfig {
        &self.client.config
    }

    /// The session timeout the server granted: the TTL of every lease.
    pub fn session_timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// The client of the current session, for diagnostics, tests and
    /// [`fenced_write`](crate::fenced_write) (its
    /// [`session`](zk::Client::session) identifies the owner of this
    /// backend's lock nodes). Every adapter names this escape hatch to its
    /// store's own client `client()`.
    ///
    /// Drop it when done: [`close`](LockBackend::close) closes the session
    /// once every handle of it is dropped, and waits for that no longer
    /// than its limit.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] once the backend is closed.
    pub fn client(&self) -> Result<zk::Client, LockError> {
        self.client.refuse_closed()?;
        let session = &self.client.current().session;
        (session.client()).map_err(|e| crate::error::map("the current session", e))
    }

    /// The old name of [`client`](Self::client).
    ///
    /// # Errors
    /// As [`client`](Self::client).
    #[deprecated(note = "use client()")]
    pub fn zk_client(&self) -> Result<zk::Client, LockError> {
        self.client()
    }

    /// The ZooKeeper path of `name`'s queue: one child of the root.
    pub fn lock_path(&self, name: &LockName) -> String {
        self.client.lock_path(name)
    }

    /// The ZooKeeper path of the reader-writer lock `name`'s queue of read
    /// and write nodes: one child of `<root>/%rw`.
    pub fn rw_lock_path(&self, name: &LockName) -> String {
        self.client.rw_lock_path(name)
    }

    /// `waiting`, ended with `Unavailable` if the client is closed
    /// meanwhile: a wait does not outlive its client (it would retry until
    /// its deadline).
    async fn until_closed<T>(
        &self,
        waiting: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        tokio::select! {
            waited = waiting => waited,
            _ = self.client.closed.cancelled() => Err(crate::error::closed()),
        }
    }
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("config", &self.client.config)
            .field("session", &self.client.current().session)
            .finish()
    }
}

#[async_trait]
impl LockBackend for ZooKeeperBackend {
    fn capabilities(&self) -> Capabilities {
        self.client.capabilities()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let client = &self.client;
        match (request.kind(), request.permits()) {
            (Kind::Lock | Kind::ReadWrite, _) => {
                (client.bounded("acquiring", request.name(), client.try_acquire(request))).await
            }
            (Kind::Semaphore, Some(permits)) => {
                let taking = client.try_acquire_permit(request, permits);
                client
                    .bounded("acquiring a permit of", request.name(), taking)
                    .await
            }
            (kind, _) => Err(kind.unsupported(BACKEND)),
        }
    }

    /// One `multi` that queues a node first in every name's queue, or
    /// nothing (see the crate docs, "Multi-locks").
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        let client = &self.client;
        let Some(first) = requests.first() else {
            return Ok(AttemptEach::Acquired(Vec::new()));
        };
        let taking = client.try_acquire_each(requests);
        (client.bounded("acquiring a multi-lock of", first.name(), taking)).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.client.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let client = &self.client;
        (client.bounded("releasing", lease.name(), client.release(lease))).await
    }

    /// Keeps the lease's node as a TTL node of `remaining` (see the crate
    /// docs): it then outlives this client's session. `Unsupported` where
    /// the servers keep no TTL nodes (`capabilities().sets_remaining`).
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        let client = &self.client;
        let setting = client.set_remaining(lease, remaining);
        (client.bounded("setting the remaining time of", lease.name(), setting)).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        let client = &self.client;
        let looking = async {
            match kind {
                Kind::Lock => Ok(client.inspect(name).await?.into_iter().collect()),
                Kind::Semaphore => client.inspect_permits(name).await,
                Kind::ReadWrite => client.inspect_shares(name).await,
                kind => Err(kind.unsupported(BACKEND)),
            }
        };
        (client.bounded("looking at the holders of", name, looking)).await
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let client = &self.client;
        (client.bounded("evicting the holder of", name, client.evict(name, expected))).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        let client = &self.client;
        let watching = async {
            match kind {
                Kind::Lock => client.watch(name).await,
                Kind::Semaphore => client.watch_permits(name).await,
                Kind::ReadWrite => client.watch_shares(name).await,
                kind => Err(kind.unsupported(BACKEND)),
            }
        };
        (client.bounded("watching", name, watching)).await
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let client = &self.client;
        let raising = client.raise_fence_floor(floor);
        (client.bounded_as(&format!("raising the fence floor to {floor}"), raising)).await
    }

    /// Loses every lease of this client (their loss signals fire), finishes
    /// its clean-ups (queue nodes of cancelled waiters), closes its session
    /// (ZooKeeper deletes its nodes at once) and ends its tasks, each step
    /// within the session timeout (at most 5 s). Clones share the client:
    /// they are all closed.
    async fn close(&self) -> Result<(), LockError> {
        self.client.close().await
    }

    /// A lock, and a reader-writer lock's read or write, waits in line (the
    /// crate docs; a waiting writer's node keeps later readers out); a
    /// permit in lockcore's loop, woken by `watch`.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.client.refuse_closed()?;
        if !matches!(request.kind(), Kind::Lock | Kind::ReadWrite) {
            let mut polling = Polling::new(self, request);
            return self.until_closed(wait::wait(wait, &mut polling)).await;
        }
        let mut waiter = LineWaiter::new(&self.client, request);
        // Requests wait out a disconnection; never let one hold the caller
        // past its deadline (dropping the waiter removes its node).
        let stuck = wait.deadline + Duration::from_millis(250);
        let waiting = wait::wait(wait, &mut waiter);
        let waited = async {
            tokio::time::timeout_at(stuck, waiting)
                .await
                .unwrap_or(Ok(None))
        };
        self.until_closed(waited).await
    }
}
