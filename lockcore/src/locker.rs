//! `Locker`: what applications hold. Waiting, renewing and tracing live here,
//! once, for every backend.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::wait::WaitPolicy;
use crate::backend::{Cleanups, Clock, LockRequest, SystemClock, Ttl};
use crate::metrics::{self, MeasuredWait, Tags, WaitOutcome};
use crate::renewer::{Held, HoldPolicy, Renewer};
use crate::request::{Access, Kind};
use crate::{
    Attempt, Backoff, Capabilities, FencingToken, Holder, HolderLabel, IntoLockName, Lease,
    LockBackend, LockError, LockGuard, LockName,
};

/// What a [`Locker`] is asked to take under a name: each kind is a
/// namespace of its own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ask {
    /// The lock.
    Lock,
    /// A permit of the semaphore with this many permits.
    Permit(u32),
    /// A share of the reader-writer lock.
    Share(Access),
}

impl Ask {
    fn kind(self) -> Kind {
        match self {
            Ask::Lock => Kind::Lock,
            Ask::Permit(_) => Kind::Semaphore,
            Ask::Share(_) => Kind::ReadWrite,
        }
    }
}

/// Acquires locks on one backend with shared defaults.
///
/// Defaults: TTL 30 s, wait up to 30 s, renew every third of the (effective)
/// TTL, backoff 10 ms doubling to 1 s with full jitter, re-check every 1 s
/// when the store notifies waiters, leases labelled `hostname:pid`, no hold
/// cap. `Locker` is cheap to clone; clones share one renewer, which renews
/// all their guards' leases in batches.
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
    /// Asked once: they are fixed for a client, and read on every acquire.
    capabilities: Capabilities,
    renewer: Renewer,
    cleanups: Cleanups,
    clock: Arc<dyn Clock>,
    label: HolderLabel,
    ttl: Duration,
    max_wait: Duration,
    backoff: Backoff,
    renew_every: Option<Duration>,
    auto_renew: bool,
    recheck: Duration,
    max_hold: Option<Duration>,
    long_hold: Option<Duration>,
    name_in_metrics: bool,
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
            capabilities: backend.capabilities(),
            renewer: Renewer::new(backend.clone()),
            cleanups: Cleanups::new(),
            backend,
            clock: Arc::new(SystemClock),
            label: HolderLabel::this_process(),
            ttl: Duration::from_secs(30),
            max_wait: Duration::from_secs(30),
            backoff: Backoff::default(),
            renew_every: None,
            auto_renew: true,
            recheck: Duration::from_secs(1),
            max_hold: None,
            long_hold: None,
            name_in_metrics: false,
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

    /// Labels leases with `label` (default `hostname:pid`): stored with the
    /// lock, shown by `inspect` and in audit events. Who owns a lease is
    /// decided by its owner token, never by the label.
    pub fn label(mut self, label: HolderLabel) -> Self {
        self.label = label;
        self
    }

    /// Counts a guard lost (and releases its lock) once it has been held for
    /// `cap`, even while renewals succeed, so a stuck critical section cannot
    /// hold a lock for ever. `lost()` fires with
    /// [`LossReason::MaxHoldExceeded`](crate::LossReason::MaxHoldExceeded).
    pub fn max_hold(mut self, cap: Duration) -> Self {
        self.max_hold = Some(cap);
        self
    }

    /// Emits one WARN event for each guard held longer than `threshold`.
    pub fn long_hold(mut self, threshold: Duration) -> Self {
        self.long_hold = Some(threshold);
        self
    }

    /// Adds the lock name as a `name` label to this locker's metrics (feature
    /// `metrics`). Off by default: every distinct name is a new time series,
    /// so turn it on only for a small, bounded set of names.
    pub fn name_in_metrics(mut self, on: bool) -> Self {
        self.name_in_metrics = on;
        self
    }

    /// Stamps and judges leases on `clock` instead of the system clocks (for
    /// tests: a clock whose boot time jumps plays a host suspend). Requests
    /// carry it to the backend, which reads it before sending
    /// ([`LockRequest::now`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// The request for `name` as `ask`, with the TTL validated and the
    /// kind checked against the capabilities before any I/O.
    pub(crate) fn request(&self, name: LockName, ask: Ask) -> Result<LockRequest, LockError> {
        let declared = match ask {
            Ask::Lock => true,
            Ask::Permit(_) => self.capabilities.semaphores,
            Ask::Share(_) => self.capabilities.rw_locks,
        };
        if !declared {
            return Err(ask.kind().unsupported(self.capabilities.backend));
        }
        let ttl = self.capabilities.effective_ttl(self.ttl)?;
        let request = LockRequest::new(name, ttl)
            .with_label(self.label.clone())
            .with_clock(self.clock.clone());
        Ok(match ask {
            Ask::Lock => request,
            Ask::Permit(n) => request.with_permits(n),
            Ask::Share(access) => request.with_access(access),
        })
    }

    /// How guards of `ttl` are kept, validated.
    pub(crate) fn hold_policy(&self, name: &LockName, ttl: Ttl) -> Result<HoldPolicy, LockError> {
        let ttl = ttl.get();
        let renew_every = if self.auto_renew {
            let every = self.renew_every.unwrap_or(ttl / 3);
            if every.is_zero() || every >= ttl.saturating_sub(Lease::drift(ttl)) {
                return Err(LockError::config(format!(
                    "renew interval {every:?} for lock \"{name}\" must be positive and shorter than the TTL {ttl:?} minus drift"
                )));
            }
            Some(every)
        } else {
            None
        };
        if self.max_hold.is_some_and(|cap| cap.is_zero()) {
            return Err(LockError::config("max_hold must be positive"));
        }
        Ok(HoldPolicy {
            renew_every,
            max_hold: self.max_hold,
            long_hold: self.long_hold,
        })
    }

    /// How this locker waits until `deadline`.
    pub(crate) fn wait_policy(&self, deadline: Instant) -> WaitPolicy {
        WaitPolicy::new(deadline)
            .backoff(self.backoff)
            .recheck(self.recheck)
    }

    pub(crate) fn tags(&self, name: &LockName) -> Tags {
        Tags::new(
            self.capabilities.backend,
            self.name_in_metrics.then_some(name),
        )
    }

    pub(crate) fn guard(&self, lease: Lease, policy: HoldPolicy) -> LockGuard {
        let tags = self.tags(lease.name());
        let held = Held::new(
            self.backend.clone(),
            self.cleanups.clone(),
            lease,
            policy,
            tags,
        );
        self.renewer.keep(held.clone());
        LockGuard::new(held)
    }

    /// One attempt, no waiting: `Ok(None)` if someone else holds the lock.
    ///
    /// # Errors
    /// Invalid name, TTL or configuration (before any I/O), or a store error.
    pub async fn try_acquire(
        &self,
        name: impl IntoLockName,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_take(name.into_lock_name()?, Ask::Lock).await
    }

    /// One attempt at `name` as `ask`: the lock, a permit of the semaphore,
    /// or a share of the reader-writer lock.
    pub(crate) async fn try_take(
        &self,
        name: LockName,
        ask: Ask,
    ) -> Result<Option<LockGuard>, LockError> {
        let request = self.request(name, ask)?;
        let policy = self.hold_policy(request.name(), request.ttl())?;
        let span = tracing::debug_span!("lock.try_acquire", name = %request.name(), fence = tracing::field::Empty);
        async {
            let tags = self.tags(request.name());
            let attempt = self.backend.try_acquire(&request).await;
            if let Err(e) = &attempt {
                metrics::store_error(&tags, e);
            }
            match attempt? {
                Attempt::Acquired(lease) => {
                    tracing::Span::current().record("fence", lease.fence().get());
                    tracing::debug!(owner = %lease.owner(), ttl = ?lease.ttl(), "acquired");
                    Ok(Some(self.guard(lease, policy)))
                }
                Attempt::Held { .. } => {
                    metrics::contended(&tags);
                    Ok(None)
                }
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
        self.take(name.into_lock_name()?, wait, Ask::Lock).await
    }

    /// Waits for `name` as `ask`: the lock, a permit of the semaphore, or a
    /// share of the reader-writer lock.
    pub(crate) async fn take(
        &self,
        name: LockName,
        wait: Duration,
        ask: Ask,
    ) -> Result<LockGuard, LockError> {
        let request = self.request(name, ask)?;
        let policy = self.hold_policy(request.name(), request.ttl())?;
        Self::check_wait(wait)?;
        let started = Instant::now();
        let waiting = self.wait_policy(started + wait);
        let span = tracing::debug_span!(
            "lock.acquire",
            name = %request.name(),
            fence = tracing::field::Empty,
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        );
        async {
            let mut wait = MeasuredWait::start(self.tags(request.name()), &waiting);
            let outcome = self.backend.acquire(&request, &waiting).await;
            let waited = started.elapsed();
            tracing::Span::current().record("waited_ms", waited.as_millis() as u64);
            match outcome {
                Ok(Some(lease)) => {
                    wait.end(WaitOutcome::Acquired);
                    tracing::Span::current().record("fence", lease.fence().get());
                    tracing::debug!(owner = %lease.owner(), ttl = ?lease.ttl(), "acquired");
                    Ok(self.guard(lease, policy))
                }
                Ok(None) => {
                    wait.end(WaitOutcome::TimedOut);
                    tracing::debug!("timed out");
                    Err(LockError::Timeout {
                        name: request.name().clone(),
                        waited,
                    })
                }
                Err(e) => {
                    metrics::store_error(&wait.tags, &e);
                    wait.end(WaitOutcome::Error);
                    Err(e)
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

    /// Refuses a wait above [`MAX_WAIT`](Self::MAX_WAIT).
    pub(crate) fn check_wait(wait: Duration) -> Result<(), LockError> {
        if wait > Self::MAX_WAIT {
            return Err(LockError::InvalidTimeout {
                timeout: wait,
                reason: format!(
                    "waits are limited to {:?}; retry in a loop to wait longer",
                    Self::MAX_WAIT
                ),
            });
        }
        Ok(())
    }

    /// A counting semaphore over this locker's backend: at most `permits`
    /// holders of `name` at once, each holding a slot with its own fencing
    /// token (see [`Semaphore`](crate::Semaphore)).
    ///
    /// # Errors
    /// An invalid name, or zero permits.
    pub fn semaphore(
        &self,
        name: impl IntoLockName,
        permits: u32,
    ) -> Result<crate::Semaphore, LockError> {
        crate::Semaphore::new(self.clone(), name.into_lock_name()?, permits)
    }

    /// A reader-writer lock over this locker's backend: readers share
    /// `name`, a writer holds it alone, and a waiting writer goes before
    /// readers that come after it (see [`RwLock`](crate::RwLock)).
    ///
    /// # Errors
    /// An invalid name.
    pub fn rw_lock(&self, name: impl IntoLockName) -> Result<crate::RwLock, LockError> {
        Ok(crate::RwLock::new(self.clone(), name.into_lock_name()?))
    }

    /// A run-once job on `name` over this locker's backend: runs on one
    /// node at a time, skipped (never waited for) while another holds it
    /// (see [`Job`](crate::Job)).
    ///
    /// # Errors
    /// An invalid name.
    pub fn job(&self, name: impl IntoLockName) -> Result<crate::Job, LockError> {
        Ok(crate::Job::new(self.clone(), name.into_lock_name()?))
    }

    /// Leader election on `name` over this locker's backend (see
    /// [`Election`](crate::Election)).
    ///
    /// # Errors
    /// An invalid name.
    pub fn election(&self, name: impl IntoLockName) -> Result<crate::Election, LockError> {
        Ok(crate::Election::new(self.clone(), name.into_lock_name()?))
    }

    /// How long [`close`](Self::close) waits for background clean-ups
    /// (releases of dropped guards) before closing the backend anyway:
    /// what is left then expires with its TTL.
    pub const CLOSE_LIMIT: Duration = Duration::from_secs(5);

    /// Shuts this locker (and its clones) down, and returns once done:
    ///
    /// 1. every guard still held is lost ([`LossReason::Closed`](crate::LossReason::Closed):
    ///    `lost()` fires, `is_held()` answers `false`) and released on the
    ///    store, owner-checked;
    /// 2. background releases of dropped guards are finished (for at most
    ///    [`CLOSE_LIMIT`](Self::CLOSE_LIMIT));
    /// 3. the backend is closed ([`LockBackend::close`]): its own clean-ups
    ///    (a cancelled waiter's queue entry, an acquire whose reply was lost)
    ///    are finished, then its connections, sessions and files closed.
    ///
    /// Call it before the process exits, so nothing it owes the store is cut
    /// short and left to block others until a TTL runs out. The backend is
    /// shared by every locker built on it: they all stop working.
    ///
    /// # Errors
    /// The backend's error from closing (what it held then expires with its TTL).
    pub async fn close(&self) -> Result<(), LockError> {
        let held = self.renewer.drain().await;
        for guard in &held {
            guard.close();
        }
        let releases = held.iter().map(|guard| async move {
            let lease = guard.lease();
            if let Err(e) = guard.backend.release(&lease).await {
                tracing::warn!(name = %lease.name(), error = %e, "release at close failed; the lock expires after its TTL");
            }
        });
        futures_util::future::join_all(releases).await;
        if !self.cleanups.finish(Self::CLOSE_LIMIT).await {
            tracing::warn!(
                pending = self.cleanups.pending(),
                "background releases unfinished at close; they expire after their TTL"
            );
        }
        self.backend.close().await
    }

    /// The TTL set with [`ttl`](Self::ttl), as requested (the store may
    /// enforce a rounded one: see [`Capabilities::effective_ttl`]).
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait set with [`max_wait`](Self::max_wait).
    pub fn get_max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The re-check interval set with [`recheck`](Self::recheck).
    pub fn get_recheck(&self) -> Duration {
        self.recheck
    }

    /// The label set with [`label`](Self::label), stored with every lease.
    pub fn get_label(&self) -> &HolderLabel {
        &self.label
    }

    /// The label this locker stores with its leases.
    #[deprecated(
        since = "0.2.0",
        note = "use `get_label`: getters pair with their setters"
    )]
    pub fn holder_label(&self) -> &HolderLabel {
        &self.label
    }

    /// The wait configured with [`max_wait`](Self::max_wait).
    #[deprecated(
        since = "0.2.0",
        note = "use `get_max_wait`: getters pair with their setters"
    )]
    pub fn wait_limit(&self) -> Duration {
        self.max_wait
    }

    /// The re-check interval configured with [`recheck`](Self::recheck).
    #[deprecated(
        since = "0.2.0",
        note = "use `get_recheck`: getters pair with their setters"
    )]
    pub fn recheck_interval(&self) -> Duration {
        self.recheck
    }

    /// The current holder of `name`, if any: fence, owner, remaining TTL and
    /// label, as the store sees them.
    ///
    /// # Errors
    /// An invalid name, or a store error.
    pub async fn inspect(&self, name: impl IntoLockName) -> Result<Option<Holder>, LockError> {
        let name = name.into_lock_name()?;
        let holders = self.backend.holders(&name, Kind::Lock).await?;
        Ok(holders.into_iter().next())
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
        let outcome = guard.while_held(critical(guard.fencing_token())).await;
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
            .field("label", &self.label)
            .field("ttl", &self.ttl)
            .field("max_wait", &self.max_wait)
            .field("renew_every", &self.renew_every)
            .field("auto_renew", &self.auto_renew)
            .field("max_hold", &self.max_hold)
            .finish_non_exhaustive()
    }
}
