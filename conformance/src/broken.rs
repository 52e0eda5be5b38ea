//! Deliberately broken clients of a real store, for tests that show a case
//! bites: [`BrokenFactory`] wraps any [`Factory`] and gives each of its
//! clients one [`Flaw`]. Flaws that only a fault proxy can reveal live here
//! (the in-memory backend has no network to cut); the others are in the
//! suite's own `tests/broken.rs`. Never use these outside tests.
//!
//! ```ignore
//! // in an adapter's tests: the phantom of a lost acquire reply is caught
//! let factory = BrokenFactory::new(redis::factory(connect), Flaw::LongGrantUntilAnswered);
//! let report = lock_conformance::run_cases(factory, |c| c.name == "lost_acquire_reply_leaves_no_phantom").await;
//! assert!(report.failures().count() == 1, "{report}");
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    ReleaseOutcome, WaitPolicy, Wakeup,
};
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
}

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
        })
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
        Some(self.inner.client_via(addr).await?.map(|c| self.wrap(c)))
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

/// One client with a flaw.
#[derive(Debug)]
struct BrokenClient {
    inner: Arc<dyn LockBackend>,
    flaw: Flaw,
}

/// How much longer than asked a [`Flaw::LongGrantUntilAnswered`] grant is
/// until its reply comes.
const LONG: u32 = 10;

/// What a [`Flaw::ShortStoreTtl`] store enforces of `ttl`.
fn short(caps: &Capabilities, ttl: Duration) -> Duration {
    caps.effective_ttl(ttl / 2).unwrap_or(ttl)
}

#[async_trait]
impl LockBackend for BrokenClient {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Attempt, LockError> {
        let caps = self.inner.capabilities();
        let ttl = caps.effective_ttl(ttl)?;
        match self.flaw {
            Flaw::LongGrantUntilAnswered => {
                let long = ttl
                    .checked_mul(LONG)
                    .and_then(|long| caps.effective_ttl(long).ok())
                    .unwrap_or(ttl);
                match self.inner.try_acquire(name, long).await? {
                    Attempt::Acquired(lease) => {
                        let asked = lease.renewed(ttl, lease.issued());
                        self.inner.renew(&asked).await?;
                        Ok(Attempt::Acquired(asked))
                    }
                    held => Ok(held),
                }
            }
            Flaw::ShortStoreTtl => Ok(
                match self.inner.try_acquire(name, short(&caps, ttl)).await? {
                    Attempt::Acquired(lease) => {
                        Attempt::Acquired(lease.renewed(ttl, lease.issued()))
                    }
                    held => held,
                },
            ),
            Flaw::LateWaiter => self.inner.try_acquire(name, ttl).await,
        }
    }

    async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        if self.flaw != Flaw::LateWaiter {
            return lockcore::acquire_loop(self, name, ttl, wait).await;
        }
        loop {
            let nap = match self.try_acquire(name, ttl).await {
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
            Flaw::LongGrantUntilAnswered | Flaw::LateWaiter => self.inner.renew(lease).await,
            Flaw::ShortStoreTtl => {
                let ttl = lease.ttl();
                let store = short(&self.inner.capabilities(), ttl);
                let renewed = self
                    .inner
                    .renew(&lease.renewed(store, lease.issued()))
                    .await?;
                Ok(renewed.renewed(ttl, renewed.issued()))
            }
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        self.inner.inspect(name).await
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch(name).await
    }
}
