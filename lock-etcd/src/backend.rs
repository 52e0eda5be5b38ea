//! `EtcdBackend`: the `LockBackend` on etcd v3 (thin: each method dispatches
//! to its role), its inherent methods, and `testing`, the views of its
//! internals this crate's tests use (hidden, not part of the API).

use std::fmt;
use std::sync::Arc;

use etcd_client::{Client, Compare, TxnOp, TxnResponse};
use lockcore::backend::wait::{WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockRequest, Polling, Ttl, async_trait};
use lockcore::{
    Attempt, AttemptEach, Capabilities, Fenced, FencingToken, Holder, Lease, LockBackend,
    LockError, LockName, ReleaseOutcome,
};

use crate::config::EtcdConfig;
use crate::connection::client::Inner;
use crate::wait;

/// Locks in etcd. See the crate docs for the design and guarantees.
///
/// Clones share one connection, one session per TTL and one watch stream;
/// call [`connect_with`](Self::connect_with) again for an independent client.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

impl EtcdBackend {
    /// Connects with an `etcd://` or `etcds://` URL (see
    /// [`EtcdConfig::from_url`]).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL; otherwise as
    /// [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(EtcdConfig::from_url(url)?).await
    }

    /// Connects, authenticates if a user is configured, and learns the
    /// smallest lease TTL the cluster enforces (by granting a 1 s lease and
    /// reading back what etcd made of it), so [`capabilities`](LockBackend::capabilities)
    /// never promises a TTL etcd would silently raise.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an invalid configuration,
    /// [`LockError::Unavailable`] when etcd cannot be reached in time,
    /// [`LockError::Store`] when it refuses (bad credentials, no permission).
    pub async fn connect_with(config: EtcdConfig) -> Result<Self, LockError> {
        Ok(EtcdBackend {
            inner: Arc::new(Inner::connect(&config).await?),
        })
    }

    /// The underlying etcd client (shares this backend's connection), for
    /// your own transactions with [`fence_compare`](Self::fence_compare).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] once the backend was closed
    /// ([`LockBackend::close`]).
    pub fn client(&self) -> Result<Client, LockError> {
        self.inner.conn.get()
    }

    /// The underlying etcd client: renamed [`client`](Self::client), the
    /// name every adapter gives its store's client.
    ///
    /// # Errors
    /// As [`client`](Self::client).
    #[deprecated(note = "use client()")]
    pub fn etcd_client(&self) -> Result<Client, LockError> {
        self.client()
    }

    /// Runs `ops` in one etcd transaction only if `token` is not older than
    /// the last token recorded under `fence_key`, and records `token` there
    /// in the same transaction: the one vocabulary of resource-side fencing
    /// across distlock's adapters (a paused holder's late write is refused
    /// once a newer holder wrote). Equal tokens pass (one holder writes many
    /// times). `fence_key` is a key of your choosing, one per protected
    /// resource; a resource shared by a semaphore's holders is fenced per
    /// slot, with one fence key per slot (`orders/42/fence/<slot>`). `ops`
    /// must not touch `fence_key`.
    ///
    /// ```no_run
    /// # async fn demo(backend: lock_etcd::EtcdBackend, guard: lockcore::LockGuard) -> Result<(), lockcore::LockError> {
    /// use lock_etcd::etcd_client::TxnOp;
    /// let write = [TxnOp::put("orders/42/status", "shipped", None)];
    /// match backend.fenced_write("orders/42/fence", guard.fencing_token(), write).await? {
    ///     Ok(_) => println!("written"),
    ///     Err(stale) => println!("refused: a newer holder (token {}) wrote first", stale.highest),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The store's, as [`LockError`]; a write refused for its token is
    /// `Ok(Err(StaleToken))`.
    pub async fn fenced_write(
        &self,
        fence_key: impl Into<Vec<u8>>,
        token: FencingToken,
        ops: impl Into<Vec<TxnOp>>,
    ) -> Result<Fenced<TxnResponse>, LockError> {
        self.inner.fenced_write(fence_key, token, ops).await
    }

    /// A `Compare` that holds only while `lease`'s grant still holds the
    /// lock: the grant's key exists with the grant's create revision. Add it
    /// to your own `Txn` so a write into etcd happens only under the lock,
    /// atomically (stronger than [`fenced_write`](Self::fenced_write): a lost
    /// lock refuses the write even before anyone else took it). The
    /// transaction needs a write or a plain (linearizable) range: etcd
    /// answers a transaction of compares alone from the member's local,
    /// possibly stale, state.
    ///
    /// ```no_run
    /// # async fn demo(backend: lock_etcd::EtcdBackend, lease: lockcore::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// use etcd_client::{Txn, TxnOp};
    /// let txn = Txn::new()
    ///     .when([backend.fence_compare(&lease)])
    ///     .and_then([TxnOp::put("inventory/sku-42", "41", None)]);
    /// let applied = backend.client()?.txn(txn).await?.succeeded();
    /// // `applied == false`: the lock was lost (expired, released or evicted); nothing was written.
    /// # Ok(()) }
    /// ```
    pub fn fence_compare(&self, lease: &Lease) -> Compare {
        self.inner.fence_compare(lease)
    }
}

/// Views of a backend's internals for this crate's tests (re-exported as
/// `lock_etcd::testing`, hidden): not part of the API.
pub mod testing {
    use lockcore::Lease;

    use super::EtcdBackend;
    use crate::locks::grant::Grant;

    /// Live sessions of the client: one lease per TTL in use, which every
    /// lock and permit of that TTL is attached to.
    pub fn sessions(backend: &EtcdBackend) -> usize {
        backend.inner.sessions.live()
    }

    /// Key prefixes the client watches on its one watch stream right now:
    /// queues it waits on (or used in the last few seconds), one per session
    /// for eviction notices, and the fence floor's key while it has a
    /// session.
    pub fn watched(backend: &EtcdBackend) -> usize {
        backend.inner.hub.watched()
    }

    /// The key that represents `lease`'s grant in etcd (`None` for a lease
    /// this backend did not grant).
    pub fn key_of(lease: &Lease) -> Option<Vec<u8>> {
        Some(lease.extension::<Grant>()?.key.clone())
    }

    /// `config` with every proof that a session is alive (and so every
    /// lease) read on `clock` instead of the system clocks: a clock whose
    /// boot time jumps plays a host suspend. A lease counts from its
    /// session's last proof of life, which is older than the request, so it
    /// is judged on this clock, not on the `Locker`'s.
    pub fn with_clock(
        config: crate::EtcdConfig,
        clock: std::sync::Arc<dyn lockcore::backend::Clock>,
    ) -> crate::EtcdConfig {
        crate::EtcdConfig { clock, ..config }
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<String> = self
            .inner
            .endpoints
            .iter()
            .map(|e| lockcore::backend::redact_url(e))
            .collect();
        f.debug_struct("EtcdBackend")
            .field("endpoints", &endpoints)
            .field("prefix", &self.inner.prefix)
            .field("min_ttl", &self.inner.caps.min_ttl)
            .field("sessions", &self.inner.sessions.live())
            .field("watched", &self.inner.hub.watched())
            .finish()
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.inner.open()?;
        match (request.kind(), request.permits(), request.access()) {
            (Kind::Lock, ..) => self.inner.try_acquire(request).await,
            (Kind::Semaphore, Some(permits), _) => {
                self.inner.try_acquire_permit(request, permits).await
            }
            (Kind::ReadWrite, _, Some(access)) => {
                self.inner.try_acquire_share(request, access).await
            }
            (kind, ..) => Err(kind.unsupported(crate::error::BACKEND)),
        }
    }

    /// Every lock or none in one `Txn` whose compares are each name's
    /// `try_acquire` condition (`locks::multi`); more names than one `Txn`
    /// takes are `Unsupported` (the locker then takes them one by one).
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        self.inner.open()?;
        crate::locks::multi::try_acquire_each(&self.inner, requests).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if let Err(closed) = self.inner.open() {
            return leases.iter().map(|_| Err(closed.clone())).collect();
        }
        self.inner.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.open()?;
        self.inner.release(lease).await
    }

    /// Moves the grant's key off its session onto an etcd lease of its own
    /// of `remaining`, rounded up to whole seconds (see `locks::remaining`):
    /// closing this client no longer frees it.
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        self.inner.open()?;
        self.inner.set_remaining(lease, remaining).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.inner.open()?;
        match kind {
            Kind::Lock => Ok(self.inner.inspect(name).await?.into_iter().collect()),
            Kind::Semaphore => self.inner.inspect_permits(name).await,
            Kind::ReadWrite => self.inner.rw_holders(name).await,
            kind => Err(kind.unsupported(crate::error::BACKEND)),
        }
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.open()?;
        self.inner.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.inner.open()?;
        match kind {
            Kind::Lock => self.inner.watch(name).await,
            Kind::Semaphore => self.inner.watch_permits(name).await,
            Kind::ReadWrite => self.inner.watch_rw(name).await,
            kind => Err(kind.unsupported(crate::error::BACKEND)),
        }
    }

    /// A lock waits in line (the crate docs), a reader or writer in its
    /// reader-writer lock's line (`rw`); a permit in lockcore's loop, woken
    /// by `watch`.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.inner.open()?;
        match request.kind() {
            Kind::Lock => wait::acquire(&self.inner, request, wait).await,
            Kind::ReadWrite => crate::rw::acquire(&self.inner, request, wait).await,
            _ => lockcore::backend::wait::wait(wait, &mut Polling::new(self, request)).await,
        }
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.capabilities().check_fence_floor(floor)?;
        self.inner.open()?;
        self.inner.raise_fence_floor(floor).await
    }

    /// Fires the loss signal of every lease this client granted and still
    /// holds, finishes its clean-ups (the entry of a waiter that gave up,
    /// for at most the request timeout), revokes its sessions (etcd deletes
    /// every key on them at once: held locks, waiting entries, anything a
    /// lost reply left), ends its watch stream, views and keeper, and drops
    /// its connection. Clones share the client: they are all closed.
    async fn close(&self) -> Result<(), LockError> {
        self.inner.close().await
    }
}
