//! `RedisBackend`: connect, and the [`LockBackend`] contract, each method
//! dispatching to the role that serves it (`locks.rs`, `permits.rs`,
//! `rw.rs`, `wait/`, `fence/`, `connection/`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::wait::{self, WaitPolicy, Wakeup};
use lockcore::backend::{CancellationToken, Kind, LockRequest, Polling, Ttl, check_permits, timed};
use lockcore::{
    Access, Attempt, AttemptEach, Capabilities, ExpiryClock, Fairness, FenceDurability, Fenced,
    FencingToken, Holder, Lease, LockBackend, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use redis::aio::ConnectionManager;

use crate::RedisConfig;
use crate::connection;
use crate::connection::client::Client;
use crate::connection::probe::{Eviction, Persistence};
use crate::error::BACKEND;
use crate::fence::{self, MAX_FENCE};
use crate::rw::WriterWaiter;
use crate::wait::LineWaiter;
use crate::wait::notify::Notifier;

/// The longest TTL accepted: one year. Redis itself accepts `PX` values of
/// hundreds of thousands of years, so the cap is ours.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Locks, semaphores and reader-writer locks in one Redis server (or a
/// Redis Cluster); multi-locks in one script per attempt on one server.
///
/// Clones share the connections; connect another backend for an
/// independent client. Each backend holds one multiplexed connection for
/// commands (reconnected automatically) and, from its first acquire, one
/// pub/sub connection shared by all its leases (a forced release reaches
/// the holder there), waiters (woken there, first come, first served) and
/// watches.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lock_redis::RedisBackend;
/// use lockcore::Locker;
///
/// let locker = Locker::new(RedisBackend::connect("redis://127.0.0.1:6379").await?);
/// let guard = locker.acquire("nightly-settlement").await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    client: Arc<Client>,
    /// Shared by the clones: dropped with the last of them.
    _last: Arc<LastHandle>,
    caps: Capabilities,
    persistence: Persistence,
    eviction: Eviction,
}

impl RedisBackend {
    /// Connects to the server `url` names (see [`RedisConfig::from_url`]).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL, [`LockError::Unavailable`]
    /// when the server cannot be reached in time, [`LockError::Store`] when it
    /// refuses the credentials.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(RedisConfig::from_url(url)?).await
    }

    /// Connects with a full configuration (an existing client or connection,
    /// key prefix, timeouts, durability requirement).
    ///
    /// Reads the server's persistence settings: without `appendfsync always`
    /// it logs a warning (fences then rely on the server clock, see the crate
    /// docs), or refuses with [`RedisConfig::require_durable_fences`].
    /// Reads its memory limit and policy (`CONFIG GET`, or `INFO memory`
    /// where an ACL denies `CONFIG`): a server that may evict keys, or
    /// whose policy neither command may read, is refused unless
    /// [`RedisConfig::allow_maxmemory_eviction`] (then it logs a warning).
    /// Persistence it cannot read is logged and reported as unknown.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), plus [`LockError::InvalidConfig`] for an
    /// invalid prefix or timeout, non-durable persistence when required, or
    /// an evicting (or unreadable) `maxmemory-policy` not accepted.
    pub async fn connect_with(config: RedisConfig) -> Result<Self, LockError> {
        let response_timeout = config.response_timeout;
        let connected = connection::connect(config).await?;
        let failover = connected.client.failover.mode();
        let cluster = connected.client.commands.is_cluster();
        let caps = capabilities(response_timeout, &connected.eviction, failover, cluster);
        let client = connected.client;
        Ok(RedisBackend {
            _last: Arc::new(LastHandle {
                closing: client.closing.clone(),
                notifier: client.notifier.clone(),
            }),
            client,
            caps,
            persistence: connected.persistence,
            eviction: connected.eviction,
        })
    }

    /// The connection lock commands use, for your own commands (e.g.
    /// [`fenced_write`](Self::fenced_write) on data kept in the same server):
    /// the escape hatch to the Redis client, named `client()` in every
    /// adapter. [`close`](LockBackend::close) ends it (a clone you hold
    /// reconnects on its next command); after close this is a new
    /// connection, yours alone, opened on first use. On a Redis Cluster, a
    /// connection to the first node that answered at connect (see
    /// `cluster_client`, feature `cluster`, for one routed by key).
    pub fn client(&self) -> ConnectionManager {
        self.client.commands.for_caller()
    }

    /// On a Redis Cluster (`redis+cluster://`), the Cluster connection lock
    /// commands use, routed by key, for your own commands (e.g.
    /// [`fenced_write`](Self::fenced_write)); `None` for one server. There,
    /// [`client`](Self::client) reaches only the first node that answered.
    #[cfg(feature = "cluster")]
    pub fn cluster_client(&self) -> Option<redis::cluster_async::ClusterConnection> {
        self.client.commands.for_caller_cluster()
    }

    /// The old name of [`client`](Self::client).
    #[deprecated(note = "use client()")]
    pub fn connection(&self) -> ConnectionManager {
        self.client()
    }

    /// The server's persistence settings, as read at connect.
    pub fn persistence(&self) -> &Persistence {
        &self.persistence
    }

    /// The server's memory limit and eviction policy, as read at connect.
    pub fn eviction(&self) -> &Eviction {
        &self.eviction
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.client.prefix
    }

    /// Runs `command` only if `token` is not older than the last token
    /// applied through `fence_key`; see [`fenced_write`](crate::fenced_write).
    ///
    /// # Errors
    /// As [`fenced_write`](crate::fenced_write); [`LockError::Unavailable`]
    /// once the backend is closed.
    pub async fn fenced_write<T: redis::FromRedisValue>(
        &self,
        fence_key: &str,
        token: FencingToken,
        command: &redis::Cmd,
    ) -> Result<Fenced<T>, LockError> {
        self.client.open()?;
        // On a Cluster, routed by the fence key (the data's keys must
        // share its slot: one hash tag).
        #[cfg(feature = "cluster")]
        if let Some(mut con) = self.cluster_client() {
            let write = fence::fenced_write(&mut con, fence_key, token, command);
            return timed(BACKEND, "fenced write", self.client.op_timeout, write).await;
        }
        let mut con = self.client();
        let write = fence::fenced_write(&mut con, fence_key, token, command);
        timed(BACKEND, "fenced write", self.client.op_timeout, write).await
    }
}

/// What the last clone of a backend does when it is dropped: nothing can
/// renew its leases any more, so each is lost at once, and its
/// subscription ends. (Background work in flight, such as undoing a lost
/// grant, keeps the client itself until it is done.)
struct LastHandle {
    closing: CancellationToken,
    notifier: Arc<Notifier>,
}

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.closing.cancel();
        self.notifier.shutdown();
    }
}

/// What a backend declares: expiry on the server's clock, FIFO waiting,
/// eviction notices within the response timeout, fences as durable as
/// the server's settings (`eviction`) make them, what a failover keeps,
/// and atomic multi-locks except on a Redis Cluster.
fn capabilities(
    response_timeout: Duration,
    eviction: &Eviction,
    failover: lockcore::Failover,
    cluster: bool,
) -> Capabilities {
    Capabilities::new(BACKEND)
        // Redis replication is asynchronous: a failover can lose the last
        // grants (fences still grow, floored at the server's clock), unless
        // a lock delay outlasts them (`fence/failover.rs`).
        .failover(failover)
        .expiry_clock(ExpiryClock::StoreWallClock)
        .ttl_range(Duration::from_millis(1), MAX_TTL)
        .ttl_granularity(Duration::from_millis(1))
        .fairness(Fairness::Fifo)
        .fence_durability(FenceDurability::Conditional(eviction.fence_assumption()))
        .notifications(true)
        .expiry_slack(Duration::from_millis(1))
        // A forced release publishes to the holder's subscription in the
        // same script: one message, on a link whose PINGs are answered
        // within the response timeout (or it is replaced and every lease
        // checked, see `wait/notify.rs`).
        .eviction_notice(Some(response_timeout))
        .semaphores(true)
        .rw_locks(true)
        // One script reaches one Cluster slot, and names' keys are spread
        // over every slot: there a multi-lock takes its names one by one
        // (`try_acquire_each` serves only names that share a slot).
        .atomic_multi(!cluster)
        .sets_remaining(true)
        .fence_floor(true)
        .max_fence(MAX_FENCE)
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.client.endpoint)
            .field("key_prefix", &self.client.prefix)
            .field("persistence", &self.persistence)
            .field("eviction", &self.eviction)
            .field("notifier", &self.client.notifier)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        match (request.kind(), request.permits()) {
            (Kind::Lock, _) => {
                let keys = self.client.keys(request.name());
                let owner = OwnerToken::new();
                let attempt = async {
                    let mut watch = None;
                    self.client
                        .acquire(request, &keys, owner, None, &mut watch)
                        .await
                };
                self.client.acquiring(attempt).await
            }
            (Kind::Semaphore, Some(permits)) => {
                check_permits(request.name(), permits)?;
                let attempt = self.client.acquire_permit(request, permits);
                self.client.acquiring(attempt).await
            }
            (Kind::ReadWrite, _) => match request.access() {
                Some(access) => {
                    let attempt = self.client.acquire_share(request, access, None);
                    self.client.acquiring(attempt).await
                }
                None => Err(Kind::ReadWrite.unsupported(BACKEND)),
            },
            (kind, _) => Err(kind.unsupported(BACKEND)),
        }
    }

    /// Every lock of `requests` or none, in one script over every name's
    /// keys, each name judged as `try_acquire` judges it (a name reserved
    /// for or queued by a waiter counts as held) and granted as it grants
    /// it. On a Redis Cluster only for names whose keys share one slot;
    /// others are [`LockError::Unsupported`] (and `atomic_multi` is not
    /// declared there).
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        let attempt = self.client.acquire_each(requests);
        self.client.acquiring(attempt).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if let Err(e) = self.client.open() {
            return leases.iter().map(|_| Err(e.clone())).collect();
        }
        self.client.renew_many(leases).await
    }

    /// A renewal by `remaining` instead of the lease's TTL: the renew
    /// script sets the key's expiry (`PEXPIRE`), or the slot's, to exactly
    /// `remaining` from the server's clock, owner- and fence-checked in the
    /// same script (and, with `wait_replicas`, acknowledged by replicas).
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        self.renew(&lease.clone().with_ttl(remaining)).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.client.open()?;
        self.client.release(lease).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.client.open()?;
        match kind {
            Kind::Lock => Ok(self.client.inspect(name).await?.into_iter().collect()),
            Kind::Semaphore => self.client.inspect_permits(name).await,
            Kind::ReadWrite => self.client.inspect_shares(name).await,
            kind => Err(kind.unsupported(BACKEND)),
        }
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.client.open()?;
        self.client.evict(name, expected).await
    }

    /// A wake-up at the next release or forced release of `name` (one
    /// message to this instance, whatever the number of its watches), or
    /// when the holder's TTL runs out; for a semaphore, of any of its
    /// slots; for a reader-writer lock, of any share, or when a waiting
    /// writer's intent goes (removed, or lapsed).
    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.client.open()?;
        let wakeup = match kind {
            Kind::Lock => {
                let keys = self.client.keys(name);
                self.client.watch(&keys.lock, &keys.watchers, &[]).await?
            }
            Kind::Semaphore => {
                let keys = self.client.permit_keys(name);
                let expiring = [keys.slots.as_str()];
                self.client
                    .watch(&keys.slots, &keys.watchers, &expiring)
                    .await?
            }
            Kind::ReadWrite => self.client.watch_shares(&self.client.rw_keys(name)).await?,
            kind => return Err(kind.unsupported(BACKEND)),
        };
        Ok(Some(wakeup))
    }

    /// A lock waits in line (see the crate docs): one wake-up per hand-off,
    /// to the first waiter only, through this instance's subscription. A
    /// permit and a read wait in lockcore's loop, woken by `watch`; a write
    /// too, leaving its intent in the store meanwhile (`rw/writer.rs`). A
    /// wait in progress when the backend closes ends with `Unavailable`.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        // The waiter lives in the tracked future: its place in line is
        // left (a clean-up) before the acquire counts as ended.
        let waiting = async {
            match (request.kind(), request.access()) {
                (Kind::Lock, _) => {
                    let mut waiter = LineWaiter::new(self.client.clone(), request, wait.recheck);
                    wait::wait(wait, &mut waiter).await
                }
                (Kind::ReadWrite, Some(Access::Write)) => {
                    let mut waiter = WriterWaiter::new(self.client.clone(), request);
                    wait::wait(wait, &mut waiter).await
                }
                _ => wait::wait(wait, &mut Polling::new(self, request)).await,
            }
        };
        self.client.acquiring(waiting).await
    }

    /// Refused before any I/O beyond [`Capabilities::max_fence_floor`]:
    /// Redis scripts count fences exactly only below 2^53.
    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.caps.check_fence_floor(floor)?;
        self.client.open()?;
        self.client.raise_fence_floor(floor).await
    }

    /// Every lease this backend (and its clones) granted is lost at once;
    /// the clean-ups it owes the store (an acquire or a permit whose reply
    /// was lost, a cancelled wait's place in line) are finished, for at
    /// most twice the operation timeout plus a second; then its
    /// subscription is ended, its tasks awaited, and its command
    /// connection closed (`QUIT`). The names it held stay taken until
    /// their TTL unless released first (`Locker::close` does).
    async fn close(&self) -> Result<(), LockError> {
        self.client.close().await;
        Ok(())
    }
}
