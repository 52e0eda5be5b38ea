//! `Locker`: what applications hold. Waiting, renewing and tracing live here,
//! once, for every backend.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    Attempt, Backoff, Clock, FencingToken, Holder, IntoLockName, LockBackend, LockError, LockGuard,
    LockName, SystemClock, WaitPolicy,
};

/// Acquires locks on one backend with shared defaults.
///
/// Defaults: TTL 30 s, wait up to 30 s, renew every third of the (effective)
/// TTL, backoff 10 ms doubling to 1 s with full jitter, re-check every 1 s
/// when the store notifies waiters. `Locker` is cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use std::time::Duration;
/// use lockcore::{Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new()).ttl(Duration::from_secs(10));
/// let total = locker
///     .with_lock("nightly-settlement", |fence| async move {
///         // pass `fence` to every write the settlement makes
///         fence.get()
///     })
///     .await?;
/// assert!(total >= 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    backend: Arc<dyn LockBackend>,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    max_wait: Duration,
    backoff: Backoff,
    renew_every: Option<Duration>,
    auto_renew: bool,
    recheck: Duration,
}

impl Locker {
    /// The longest wait `acquire` accepts: one year.
    pub const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

    /// A locker on `backend` with default settings.
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker on a shared, type-erased backend (what `distlock::connect` returns).
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Locker {
            backend,
            clock: Arc::new(SystemClock),
            ttl: Duration::from_secs(30),
            max_wait: Duration::from_secs(30),
            backoff: Backoff::default(),
            renew_every: None,
            auto_renew: true,
            recheck: Duration::from_secs(1),
        }
    }

    /// Sets the lease TTL requested from the store.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long [`acquire`](Self::acquire) waits (at most [`MAX_WAIT`](Self::MAX_WAIT)).
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }

    /// Sets the backoff used between attempts when the store does not notify.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Renews every `every` instead of a third of the TTL; must be shorter than the TTL.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Turns background renewal on (default) or off. Without it, a guard is
    /// lost at its local deadline.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// With store notifications, re-check at least this often anyway.
    pub fn recheck(mut self, every: Duration) -> Self {
        self.recheck = every;
        self
    }

    /// Judges guards' deadlines on `clock` instead of the system clocks (for
    /// tests: a clock whose boot time jumps plays a host suspend).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// The renew interval for an effective TTL, validated.
    fn renew_interval(&self, name: &LockName) -> Result<Option<Duration>, LockError> {
        if !self.auto_renew {
            return Ok(None);
        }
        let ttl = self.backend.capabilities().effective_ttl(self.ttl)?;
        let every = self.renew_every.unwrap_or(ttl / 3);
        if every.is_zero() || every >= ttl.saturating_sub(crate::Lease::drift(ttl)) {
            return Err(LockError::config(format!(
                "renew interval {every:?} for lock \"{name}\" must be positive and shorter than the TTL {ttl:?} minus drift"
            )));
        }
        Ok(Some(every))
    }

    fn guard(&self, lease: crate::Lease, renew_every: Option<Duration>) -> LockGuard {
        LockGuard::start(self.backend.clone(), self.clock.clone(), lease, renew_every)
    }

    /// One attempt, no waiting: `Ok(None)` if someone else holds the lock.
    ///
    /// # Errors
    /// Invalid name, TTL or configuration (before any I/O), or a store error.
    pub async fn try_acquire(
        &self,
        name: impl IntoLockName,
    ) -> Result<Option<LockGuard>, LockError> {
        let name = name.into_lock_name()?;
        let renew_every = self.renew_interval(&name)?;
        let span =
            tracing::info_span!("lock.try_acquire", name = %name, fence = tracing::field::Empty);
        async {
            match self.backend.try_acquire(&name, self.ttl).await? {
                Attempt::Acquired(lease) => {
                    tracing::Span::current().record("fence", lease.fence().get());
                    tracing::info!(owner = %lease.owner(), ttl = ?lease.ttl(), "acquired");
                    Ok(Some(self.guard(lease, renew_every)))
                }
                Attempt::Held { .. } => Ok(None),
            }
        }
        .instrument(span)
        .await
    }

    /// Waits up to the configured max wait for the lock, woken by the store's
    /// change notifications where it has them and by jittered backoff
    /// otherwise.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out; invalid name, TTL or
    /// configuration before any I/O; a store error that retrying did not fix.
    ///
    /// # Cancel safety
    /// Dropping the future stops waiting and leaves nothing queued. If an
    /// attempt was in flight the store may have granted it; such a grant is
    /// never renewed and expires after one TTL.
    pub async fn acquire(&self, name: impl IntoLockName) -> Result<LockGuard, LockError> {
        self.acquire_timeout(name, self.max_wait).await
    }

    /// Like [`acquire`](Self::acquire) with an explicit wait.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); [`LockError::InvalidTimeout`] for a wait
    /// above [`MAX_WAIT`](Self::MAX_WAIT).
    pub async fn acquire_timeout(
        &self,
        name: impl IntoLockName,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        let name = name.into_lock_name()?;
        let renew_every = self.renew_interval(&name)?;
        if wait > Self::MAX_WAIT {
            return Err(LockError::InvalidTimeout {
                timeout: wait,
                reason: format!(
                    "waits are limited to {:?}; retry in a loop to wait longer",
                    Self::MAX_WAIT
                ),
            });
        }
        let started = Instant::now();
        let policy = WaitPolicy::new(started + wait)
            .backoff(self.backoff)
            .recheck(self.recheck);
        let span = tracing::info_span!(
            "lock.acquire",
            name = %name,
            fence = tracing::field::Empty,
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        );
        async {
            let outcome = self.backend.acquire(&name, self.ttl, &policy).await;
            let waited = started.elapsed();
            tracing::Span::current().record("waited_ms", waited.as_millis() as u64);
            match outcome? {
                Some(lease) => {
                    tracing::Span::current().record("fence", lease.fence().get());
                    tracing::info!(owner = %lease.owner(), ttl = ?lease.ttl(), "acquired");
                    Ok(self.guard(lease, renew_every))
                }
                None => {
                    tracing::info!("timed out");
                    Err(LockError::Timeout {
                        name: name.clone(),
                        waited,
                    })
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Like [`acquire`](Self::acquire), but gives up with
    /// [`LockError::Cancelled`] as soon as `cancel` is cancelled.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), plus [`LockError::Cancelled`].
    pub async fn acquire_cancellable(
        &self,
        name: impl IntoLockName,
        cancel: &CancellationToken,
    ) -> Result<LockGuard, LockError> {
        let name = name.into_lock_name()?;
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(LockError::Cancelled { name }),
            guard = self.acquire(&name) => guard,
        }
    }

    /// Evicts whoever holds `name`, audited (see [`admin::force_release`](crate::admin::force_release)).
    /// Returns the evicted holder, or `None` if the lock was free.
    ///
    /// # Errors
    /// An invalid name, or a store error (the outcome is then unknown:
    /// inspect, and retry with [`force_release_if`](Self::force_release_if)).
    pub async fn force_release(
        &self,
        name: impl IntoLockName,
        reason: &str,
    ) -> Result<Option<Holder>, LockError> {
        let name = name.into_lock_name()?;
        crate::admin::force_release(&*self.backend, &name, reason, None).await
    }

    /// Evicts the holder of `name` only if its fencing token is `fence`
    /// (compare-and-evict), audited. Safe to retry after a lost reply: it
    /// never evicts a later holder. Returns the evicted holder, or `None`.
    ///
    /// # Errors
    /// As [`force_release`](Self::force_release).
    pub async fn force_release_if(
        &self,
        name: impl IntoLockName,
        fence: FencingToken,
        reason: &str,
    ) -> Result<Option<Holder>, LockError> {
        let name = name.into_lock_name()?;
        crate::admin::force_release(&*self.backend, &name, reason, Some(fence)).await
    }

    /// Runs `critical` while holding `name`, and stops it (by dropping its
    /// future) the moment the lease is lost.
    ///
    /// `critical` receives the fencing token to pass to the resource it
    /// writes. The lock is released when `critical` completes.
    ///
    /// # Errors
    /// Any [`acquire`](Self::acquire) error, or [`LockError::Lost`] if the
    /// lease was lost before `critical` completed.
    pub async fn with_lock<F, Fut, T>(
        &self,
        name: impl IntoLockName,
        critical: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(name).await?;
        let fence = guard.fencing_token();
        let outcome = tokio::select! {
            biased;
            reason = guard.lost() => Err(LockError::Lost { name: guard.name(), fence, reason }),
            value = critical(fence) => Ok(value),
        };
        if outcome.is_ok()
            && let Err(e) = guard.release().await
        {
            tracing::warn!(error = %e, "release after the critical section failed; the lock expires after its TTL");
        }
        outcome
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.backend)
            .field("ttl", &self.ttl)
            .field("max_wait", &self.max_wait)
            .field("renew_every", &self.renew_every)
            .field("auto_renew", &self.auto_renew)
            .finish_non_exhaustive()
    }
}
