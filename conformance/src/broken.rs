//! Deliberately broken clients of a real store, for tests that show a case
//! bites: [`BrokenFactory`] wraps any [`Factory`] and gives each of its
//! clients one [`Flaw`]. Flaws that only a fault proxy can reveal live here
//! (the in-memory backend has no network to cut); the others are in the
//! suite's own `tests/broken.rs`. Never use these outside tests.
//!
//! ```ignore
//! // in an adapter's tests: the phantom of a lost acquire reply is caught
//! let factory = BrokenFactory::new(StoreFactory::redis(connect), Flaw::LongGrantUntilAnswered);
//! let report = lock_conformance::run_cases(factory, |c| c.name == "lost_acquire_reply_leaves_no_phantom").await;
//! assert!(report.failures().count() == 1, "{report}");
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::wait::{self, WaitPolicy, Wakeup};
use lockcore::backend::{CancellationToken, Kind, LockRequest, Polling, Ttl};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    ReleaseOutcome,
};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use crate::{Factory, StoreControl};

/// What is wrong with a [`BrokenFactory`]'s clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Flaw {
    /// Every acquire asks the store for ten times the TTL and, once the
    /// reply is in, shortens the grant to the TTL asked with a renewal. When
    /// the reply is lost, the long grant stays behind: a phantom that blocks
    /// the name for ten TTLs. (Shortening works where renew sets the store's
    /// TTL from the lease, as on Redis and PostgreSQL; elsewhere every grant
    /// stays long, which the same case catches.)
    LongGrantUntilAnswered,
    /// The store enforces half the TTL the lease reports: another client
    /// can be granted the lock before a silent holder's local deadline, even
    /// when the holder's last renewal reached the store.
    ShortStoreTtl,
    /// A waiting acquire that finds the lock held sleeps a whole TTL past
    /// the holder's reported expiry before it tries again: a waiter served
    /// one TTL late.
    LateWaiter,
    /// The store frees a client's locks when the client's connection dies
    /// (a session lock declared per-lock), and the client learns it only
    /// [`NOTICE_LAG`] later. Proxied clients keep an idle connection through
    /// the proxy as their "session" (a store that leaves an idle connection
    /// open, like Redis, is needed).
    FreedWithConnection,
    /// A grant's lease counts from the moment its reply (or the message
    /// carrying it) arrived, not from the request the store granted on: a
    /// grant that reaches the client late is believed to last longer than
    /// the store keeps it.
    LeaseFromReply,
    /// Every attempt runs to its end even when its caller is dropped, and
    /// the client keeps each grant alive until it is released (as a store
    /// whose grants ride on a session the client keeps alive for its other
    /// locks, with nothing undone when a caller goes): an attempt dropped
    /// in flight leaves a holder nobody knows of, for as long as the client
    /// lives.
    KeepsDroppedGrants,
}

/// How late a [`Flaw::FreedWithConnection`] client learns that its locks
/// went with its connection.
pub const NOTICE_LAG: Duration = Duration::from_millis(200);

/// A [`Factory`] whose clients (direct, proxied and private) carry `flaw`;
/// the store and everything else are the wrapped factory's.
pub struct BrokenFactory {
    inner: Arc<dyn Factory>,
    flaw: Flaw,
}

impl std::fmt::Debug for BrokenFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokenFactory")
            .field("flaw", &self.flaw)
            .finish_non_exhaustive()
    }
}

impl BrokenFactory {
    /// `inner`'s clients, with `flaw`.
    pub fn new(inner: impl Factory, flaw: Flaw) -> Self {
        BrokenFactory {
            inner: Arc::new(inner),
            flaw,
        }
    }

    fn wrap(&self, client: Arc<dyn LockBackend>) -> Arc<dyn LockBackend> {
        Arc::new(BrokenClient {
            inner: client,
            flaw: self.flaw,
            held: Arc::default(),
        })
    }

    /// A [`Flaw::FreedWithConnection`] client through `addr`: its session
    /// is an idle connection there; when that dies, its locks are evicted on
    /// the store, and the client hears of it `NOTICE_LAG` later.
    async fn session_client(
        &self,
        addr: SocketAddr,
        inner: Arc<dyn LockBackend>,
    ) -> Result<Arc<dyn LockBackend>, LockError> {
        let mut session = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| LockError::unavailable("broken", e))?;
        let held: Held = Arc::default();
        let (store, locks) = (inner.clone(), held.clone());
        tokio::spawn(async move {
            let mut buf = [0_u8; 64];
            while matches!(session.read(&mut buf).await, Ok(n) if n > 0) {}
            let gone: Vec<_> =
                std::mem::take(&mut *locks.lock().unwrap_or_else(|p| p.into_inner()));
            for (lease, _) in &gone {
                let _ = store.evict(lease.name(), Some(lease.fence())).await;
            }
            tokio::time::sleep(NOTICE_LAG).await;
            for (_, lost) in gone {
                lost.cancel();
            }
        });
        Ok(Arc::new(BrokenClient {
            inner,
            flaw: self.flaw,
            held,
        }))
    }
}

#[async_trait]
impl Factory for BrokenFactory {
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(self.wrap(self.inner.client().await?))
    }

    fn store(&self) -> Option<Arc<dyn StoreControl>> {
        self.inner.store()
    }

    async fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        let client = self.inner.client_via(addr).await?;
        Some(match (self.flaw, client) {
            (Flaw::FreedWithConnection, Ok(inner)) => self.session_client(addr, inner).await,
            (_, client) => client.map(|c| self.wrap(c)),
        })
    }

    async fn private(&self) -> Option<Result<Arc<dyn Factory>, LockError>> {
        let flaw = self.flaw;
        Some(
            self.inner
                .private()
                .await?
                .map(|inner| Arc::new(BrokenFactory { inner, flaw }) as Arc<dyn Factory>),
        )
    }

    fn skip_all(&self) -> Option<String> {
        self.inner.skip_all()
    }

    fn helper_env(&self) -> Vec<(String, String)> {
        self.inner.helper_env()
    }
}

/// The grants of a [`Flaw::FreedWithConnection`] client, with their loss signals.
type Held = Arc<Mutex<Vec<(Lease, CancellationToken)>>>;

/// One client with a flaw.
#[derive(Debug)]
struct BrokenClient {
    inner: Arc<dyn LockBackend>,
    flaw: Flaw,
    held: Held,
}

/// A [`Flaw::KeepsDroppedGrants`] grant, renewed every third of its TTL
/// until a renewal fails (it was released, or lost).
async fn keep_alive(store: Arc<dyn LockBackend>, mut lease: Lease) {
    loop {
        tokio::time::sleep(lease.ttl().get() / 3).await;
        match store.renew(&lease).await {
            Ok(renewed) => lease = renewed,
            Err(_) => return,
        }
    }
}

/// How much longer than asked a [`Flaw::LongGrantUntilAnswered`] grant is
/// until its reply comes.
const LONG: u32 = 10;

/// What a [`Flaw::ShortStoreTtl`] store enforces of `ttl`.
fn short(caps: &Capabilities, ttl: Ttl) -> Ttl {
    caps.effective_ttl(ttl.get() / 2).unwrap_or(ttl)
}

#[async_trait]
impl LockBackend for BrokenClient {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let caps = self.inner.capabilities();
        let ttl = request.ttl();
        let asking = |ttl: Ttl| {
            LockRequest::new(request.name().clone(), ttl).with_label(request.label().clone())
        };
        match self.flaw {
            Flaw::LongGrantUntilAnswered => {
                let long = ttl
                    .get()
                    .checked_mul(LONG)
                    .and_then(|long| caps.effective_ttl(long).ok())
                    .unwrap_or(ttl);
                match self.inner.try_acquire(&asking(long)).await? {
                    Attempt::Acquired(lease) => {
                        let asked = lease.with_ttl(ttl);
                        self.inner.renew(&asked).await?;
                        Ok(Attempt::Acquired(asked))
                    }
                    held => Ok(held),
                }
            }
            Flaw::ShortStoreTtl => Ok(
                match self.inner.try_acquire(&asking(short(&caps, ttl))).await? {
                    Attempt::Acquired(lease) => Attempt::Acquired(lease.with_ttl(ttl)),
                    held => held,
                },
            ),
            Flaw::LateWaiter => self.inner.try_acquire(request).await,
            Flaw::FreedWithConnection => Ok(match self.inner.try_acquire(request).await? {
                Attempt::Acquired(lease) => {
                    let lost = CancellationToken::new();
                    let lease = lease.with_loss_signal(lost.clone());
                    let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                    held.push((lease.clone(), lost));
                    Attempt::Acquired(lease)
                }
                held => held,
            }),
            Flaw::LeaseFromReply => Ok(match self.inner.try_acquire(request).await? {
                Attempt::Acquired(lease) => Attempt::Acquired(lease.renewed(lease.now())),
                held => held,
            }),
            Flaw::KeepsDroppedGrants => {
                let (inner, request) = (self.inner.clone(), request.clone());
                tokio::spawn(async move {
                    let attempt = inner.try_acquire(&request).await;
                    if let Ok(Attempt::Acquired(lease)) = &attempt {
                        tokio::spawn(keep_alive(inner, lease.clone()));
                    }
                    attempt
                })
                .await
                .map_err(|e| LockError::unavailable("broken", e))?
            }
        }
    }

    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        if self.flaw != Flaw::LateWaiter {
            return wait::wait(wait, &mut Polling::new(self, request)).await;
        }
        let ttl = request.ttl().get();
        loop {
            let nap = match self.try_acquire(request).await {
                Ok(Attempt::Acquired(lease)) => return Ok(Some(lease)),
                Ok(Attempt::Held { expires_in }) => expires_in.unwrap_or(ttl) + ttl,
                Err(e) if e.is_retryable() => wait.backoff.delay(0),
                Err(e) => return Err(e),
            };
            if Instant::now() >= wait.deadline {
                return Ok(None);
            }
            tokio::time::sleep_until((Instant::now() + nap).min(wait.deadline)).await;
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        match self.flaw {
            Flaw::LongGrantUntilAnswered
            | Flaw::LateWaiter
            | Flaw::FreedWithConnection
            | Flaw::LeaseFromReply
            | Flaw::KeepsDroppedGrants => self.inner.renew(lease).await,
            Flaw::ShortStoreTtl => {
                let ttl = lease.ttl();
                let store = short(&self.inner.capabilities(), ttl);
                let renewed = self.inner.renew(&lease.clone().with_ttl(store)).await?;
                Ok(renewed.with_ttl(ttl))
            }
        }
    }

    /// Each lease through the flawed [`renew`](Self::renew), one by one.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut renewed = Vec::with_capacity(leases.len());
        for lease in leases {
            renewed.push(self.renew(lease).await);
        }
        renewed
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.inner.holders(name, kind).await
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch(name, kind).await
    }
}
