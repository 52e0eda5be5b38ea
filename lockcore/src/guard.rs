//! `LockGuard`: a held lock that renews itself and says the moment it is lost.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    Backoff, Clock, FencingToken, Lease, LockBackend, LockError, LockName, LossReason, Moment,
    ReleaseOutcome,
};

/// A held lock.
///
/// While it lives, a background task renews the lease every renew interval
/// (a third of the TTL by default). The guard counts the lock as lost, and
/// fires [`lost`](Self::lost), when a renewal is refused, when no renewal is
/// answered before the local deadline, when the deadline passes, or when the
/// store reports the lease gone. A lost lease is never resurrected.
///
/// Check [`is_held`](Self::is_held) before acting, and pass
/// [`fencing_token`](Self::fencing_token) to the resource you protect: that
/// is what turns a late, paused holder into a refused write instead of a
/// corrupted one.
///
/// # Release
/// Call [`release`](Self::release) to release and learn the outcome.
/// Release-on-drop is not immediate: `Drop` stops renewing and *spawns* a
/// best-effort release on the current tokio runtime (it never blocks); with
/// no runtime, the lock expires after its TTL.
#[must_use = "dropping a LockGuard releases the lock in the background; keep it while you act"]
pub struct LockGuard {
    shared: Arc<Shared>,
    renewal: Option<JoinHandle<()>>,
    released: bool,
}

struct Shared {
    backend: Arc<dyn LockBackend>,
    clock: Arc<dyn Clock>,
    lease: Mutex<Lease>,
    lost: CancellationToken,
    reason: OnceLock<LossReason>,
    stop: CancellationToken,
}

impl Shared {
    fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes `lease` as the current one, its send time carried over onto
    /// this guard's clock (backends stamp leases with the system clocks; the
    /// guard judges them on its own).
    fn adopt(&self, lease: Lease) {
        let now = self.clock.now();
        let sent = lease.issued_at();
        let back = now.mono().saturating_duration_since(sent);
        let issued = Moment::from_parts(sent, now.boot().map(|b| b.saturating_sub(back)));
        let lease = lease.renewed(lease.ttl(), issued);
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = lease;
    }

    fn mark_lost(&self, reason: LossReason) {
        if self.reason.set(reason.clone()).is_ok() {
            let lease = self.lease();
            tracing::warn!(name = %lease.name(), fence = %lease.fence(), %reason, "lease lost");
        }
        self.lost.cancel();
    }
}

impl LockGuard {
    /// Wraps `lease` and starts the renewal task (`renew_every: None` only
    /// watches the deadline). Must be called inside a tokio runtime.
    pub(crate) fn start(
        backend: Arc<dyn LockBackend>,
        clock: Arc<dyn Clock>,
        lease: Lease,
        renew_every: Option<Duration>,
    ) -> Self {
        let shared = Arc::new(Shared {
            backend,
            clock,
            lease: Mutex::new(lease.clone()),
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            stop: CancellationToken::new(),
        });
        shared.adopt(lease);
        let renewal = tokio::spawn(keep_alive(shared.clone(), renew_every));
        LockGuard {
            shared,
            renewal: Some(renewal),
            released: false,
        }
    }

    /// The fencing token of this grant. Renewals keep it.
    pub fn fencing_token(&self) -> FencingToken {
        self.shared.lease().fence()
    }

    /// The lock's name.
    pub fn name(&self) -> LockName {
        self.shared.lease().name().clone()
    }

    /// The current lease (updated by each renewal).
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// Whether the lock is still held: not lost, and the local deadline of the
    /// latest renewal has not passed (time the host spent suspended counts).
    /// Check it right before acting.
    pub fn is_held(&self) -> bool {
        !self.shared.lost.is_cancelled()
            && !self.shared.lease().is_expired_at(self.shared.clock.now())
    }

    /// The fencing token if the lock is still held.
    ///
    /// # Errors
    /// [`LockError::Lost`] once the lease is lost.
    pub fn ensure_held(&self) -> Result<FencingToken, LockError> {
        let lease = self.shared.lease();
        if self.is_held() {
            Ok(lease.fence())
        } else {
            Err(LockError::Lost {
                name: lease.name().clone(),
                fence: lease.fence(),
                reason: self.loss_reason().unwrap_or(LossReason::DeadlinePassed),
            })
        }
    }

    /// Completes when the lease is lost, with the reason. Use it in
    /// `tokio::select!` to stop work the moment the lock is gone.
    pub async fn lost(&self) -> LossReason {
        self.shared.lost.cancelled().await;
        self.loss_reason().unwrap_or(LossReason::DeadlinePassed)
    }

    /// A token cancelled when the lease is lost, to hand to other tasks.
    /// Cancelling it yourself does not affect the guard.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Why the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.reason.get().cloned()
    }

    /// Stops renewing and releases the lock on the store.
    ///
    /// Returns [`ReleaseOutcome::NotHeld`] when the store no longer held this
    /// lease (it expired or was taken): nothing was changed, and in particular
    /// a later holder's lock was not touched.
    ///
    /// # Errors
    /// A store error; the lock then expires after its TTL.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        self.released = true;
        self.shared.stop.cancel();
        if let Some(renewal) = self.renewal.take() {
            let _ = renewal.await;
        }
        let lease = self.shared.lease();
        let span = tracing::info_span!("lock.release", name = %lease.name(), fence = %lease.fence(), owner = %lease.owner());
        async {
            let outcome = self.shared.backend.release(&lease).await;
            match &outcome {
                Ok(ReleaseOutcome::Released) => tracing::info!("released"),
                Ok(ReleaseOutcome::NotHeld) => {
                    tracing::warn!("release: the store no longer held this lease")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "release failed; the lock expires after its TTL")
                }
            }
            outcome
        }
        .instrument(span)
        .await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.shared.stop.cancel();
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        let lease = self.shared.lease();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let backend = self.shared.backend.clone();
                runtime.spawn(async move {
                    match backend.release(&lease).await {
                        Ok(outcome) => tracing::debug!(name = %lease.name(), fence = %lease.fence(), ?outcome, "released on drop"),
                        Err(e) => tracing::warn!(name = %lease.name(), error = %e, "release on drop failed; the lock expires after its TTL"),
                    }
                });
            }
            Err(_) => {
                tracing::debug!(name = %lease.name(), "guard dropped outside a runtime; the lock expires after its TTL")
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.shared.lease())
            .field("held", &self.is_held())
            .field("loss_reason", &self.loss_reason())
            .finish()
    }
}

/// How often a waiting guard looks at the clocks even when no timer is due:
/// timers run on the monotonic clock, which stops while the host is
/// suspended, so after a resume this bounds how late `lost()` fires.
const SUSPEND_CHECK: Duration = Duration::from_secs(1);

/// The renewal task: renews once `every` has elapsed since the lease was
/// issued, retries transient errors until the deadline, and marks the lease
/// lost on refusal, on silence past the deadline, or on the store's own loss
/// signal. Elapsed time is judged on the guard's clock (suspend counts).
async fn keep_alive(shared: Arc<Shared>, every: Option<Duration>) {
    let store_lost = shared.lease().loss_signal().cloned().unwrap_or_default();
    let retry = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    // Never renew twice within a quarter interval, whatever a lease claims.
    let mut quiet_until: Option<Instant> = None;
    loop {
        let lease = shared.lease();
        let now = shared.clock.now();
        let remaining = lease.remaining_at(now);
        if remaining.is_zero() {
            return shared.mark_lost(LossReason::DeadlinePassed);
        }
        let to_renew = every.map(|every| {
            let due = every.saturating_sub(now.since(lease.issued()));
            let quiet =
                quiet_until.map_or(Duration::ZERO, |q| q.saturating_duration_since(now.mono()));
            due.max(quiet)
        });
        if to_renew != Some(Duration::ZERO) {
            let nap = to_renew
                .unwrap_or(Duration::MAX)
                .min(remaining)
                .min(SUSPEND_CHECK);
            tokio::select! {
                biased;
                _ = shared.stop.cancelled() => return,
                _ = store_lost.cancelled() => return shared.mark_lost(LossReason::StoreReported),
                _ = tokio::time::sleep(nap) => continue,
            }
        }
        let deadline = lease.deadline();
        let span = tracing::debug_span!("lock.renew", name = %lease.name(), fence = %lease.fence());
        let mut attempt = 0;
        loop {
            let outcome = tokio::select! {
                biased;
                _ = shared.stop.cancelled() => return,
                _ = store_lost.cancelled() => return shared.mark_lost(LossReason::StoreReported),
                r = tokio::time::timeout_at(deadline, shared.backend.renew(&lease)).instrument(span.clone()) => r,
            };
            match outcome {
                Err(_) => return shared.mark_lost(LossReason::RenewalUnanswered),
                Ok(Ok(renewed)) => {
                    // Adopt only a reply that came before the old deadline
                    // (timeout_at, and the clocks for a suspend meanwhile);
                    // its own deadline counts from its send time.
                    if lease.is_expired_at(shared.clock.now()) {
                        return shared.mark_lost(LossReason::RenewalUnanswered);
                    }
                    shared.adopt(renewed);
                    quiet_until = every.map(|every| Instant::now() + every / 4);
                    break;
                }
                Ok(Err(LockError::NotHeld { .. })) => {
                    return shared.mark_lost(LossReason::RenewalRefused);
                }
                Ok(Err(e)) if e.is_retryable() => {
                    tracing::debug!(parent: &span, error = %e, attempt, "renewal failed, retrying");
                    let pause = (Instant::now() + retry.delay(attempt)).min(deadline);
                    attempt += 1;
                    tokio::select! {
                        biased;
                        _ = shared.stop.cancelled() => return,
                        _ = tokio::time::sleep_until(pause) => {}
                    }
                    if lease.is_expired_at(shared.clock.now()) {
                        return shared.mark_lost(LossReason::RenewalUnanswered);
                    }
                }
                Ok(Err(e)) => return shared.mark_lost(LossReason::RenewalFailed(e.to_string())),
            }
        }
    }
}
