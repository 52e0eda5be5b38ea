//! `LockGuard`: a held lock that renews itself and says the moment it is lost.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::renewer::{Held, release_in_background};
use crate::{Access, FencingToken, Lease, LockError, LockName, LossReason, ReleaseOutcome};

/// A held lock.
///
/// While it lives, its [`Locker`](crate::Locker)'s renewer renews the lease
/// every renew interval (a third of the TTL by default), batched with every
/// other lease of that locker. The guard counts the lock as lost, and fires
/// [`lost`](Self::lost), when a renewal is refused, when no renewal is
/// answered before the local deadline, when the deadline passes (time the
/// host spent suspended counts), when the store reports the lease gone (a
/// forced release, a lost session), or when the locker's
/// [`max_hold`](crate::Locker::max_hold) runs out. A lost lease is never
/// resurrected.
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
    held: Arc<Held>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(held: Arc<Held>) -> Self {
        LockGuard {
            held,
            released: false,
        }
    }

    /// The fencing token of this grant. Renewals keep it.
    pub fn fencing_token(&self) -> FencingToken {
        self.held.lease().fence()
    }

    /// The semaphore slot this guard holds (`None` for a lock).
    pub fn slot(&self) -> Option<u32> {
        self.held.lease().slot()
    }

    /// How this guard holds a reader-writer lock (`None` for a lock or a
    /// permit).
    pub fn access(&self) -> Option<Access> {
        self.held.lease().access()
    }

    /// The lock's name.
    pub fn name(&self) -> LockName {
        self.held.lease().name().clone()
    }

    /// The current lease (updated by each renewal).
    pub fn lease(&self) -> Lease {
        self.held.lease()
    }

    /// Whether the lock is still held: not lost, and the local deadline of the
    /// latest renewal has not passed (time the host spent suspended counts).
    /// Check it right before acting.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// The fencing token if the lock is still held.
    ///
    /// # Errors
    /// [`LockError::Lost`] once the lease is lost.
    pub fn ensure_held(&self) -> Result<FencingToken, LockError> {
        let lease = self.held.lease();
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
        self.held.lost.cancelled().await;
        self.loss_reason().unwrap_or(LossReason::DeadlinePassed)
    }

    /// A token cancelled when the lease is lost, to hand to other tasks.
    /// Cancelling it yourself does not affect the guard.
    pub fn lost_token(&self) -> CancellationToken {
        self.held.lost.child_token()
    }

    /// Why the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.held.loss_reason()
    }

    /// Time since the grant was asked for, on the locker's clocks.
    pub(crate) fn held_for(&self) -> Duration {
        self.held.held_for()
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
        self.held.stop_holding();
        let lease = self.held.lease();
        let span = tracing::debug_span!("lock.release", name = %lease.name(), fence = %lease.fence(), owner = %lease.owner());
        async {
            let outcome = self.held.backend.release(&lease).await;
            match &outcome {
                Ok(ReleaseOutcome::Released) => tracing::debug!("released"),
                Ok(ReleaseOutcome::NotHeld) => {
                    tracing::warn!("release: the store no longer held this lease")
                }
                Err(e) => {
                    crate::metrics::store_error(&self.held.tags, e);
                    tracing::warn!(error = %e, "release failed; the lock expires after its TTL")
                }
            }
            outcome
        }
        .instrument(span)
        .await
    }

    /// Ends the hold but leaves the name taken until `at_least` has passed
    /// since the grant, judged by the store: what keeps a job that ended
    /// early from running again on another node in the same window.
    ///
    /// Renewals stop. If `at_least` has passed, the lock is released as by
    /// [`release`](Self::release). Otherwise the store is told to keep the
    /// lease for exactly what is left ([`LockBackend::set_remaining`](crate::LockBackend::set_remaining),
    /// on the store's clock), and nothing is released: the store frees the
    /// name then, whether or not this process is still alive. What is left
    /// is counted from when the grant's reply was *received* on this
    /// client's monotonic clock, plus the drift margin of a lease
    /// ([`Lease::drift`]) and rounded up to the store's TTL granularity, so
    /// it is never short: the store may keep the name longer by up to one
    /// round trip (the grant's reply and this call's request in flight) and
    /// that margin. No wall clock is read, so a client whose clock is set
    /// wrong cannot shorten it.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] (before any I/O) when the backend cannot
    /// set a lease's remaining time ([`Capabilities::sets_remaining`](crate::Capabilities::sets_remaining));
    /// [`LockError::InvalidTtl`] when what is left is beyond the store's
    /// largest TTL; a store error (the lease then expires at its own TTL,
    /// which may be sooner than `at_least`).
    pub async fn release_no_sooner_than(
        mut self,
        at_least: Duration,
    ) -> Result<HoldEnd, LockError> {
        let capabilities = self.held.backend.capabilities();
        if !capabilities.sets_remaining {
            return Err(LockError::Unsupported {
                backend: capabilities.backend,
                operation: "set_remaining",
            });
        }
        let held_for = self.held.held_for();
        let left = (at_least + Lease::drift(held_for)).saturating_sub(held_for);
        if left.is_zero() {
            return self.release().await.map(HoldEnd::from);
        }
        let remaining = capabilities.effective_remaining(left.max(capabilities.min_ttl))?;
        self.released = true;
        self.held.stop_holding();
        let lease = self.held.lease();
        let span = tracing::debug_span!("lock.release_no_sooner_than", name = %lease.name(), fence = %lease.fence(), remaining = ?remaining.get());
        async {
            match self.held.backend.set_remaining(&lease, remaining).await {
                Ok(_) => {
                    tracing::debug!("left to expire at least {at_least:?} after the grant");
                    Ok(HoldEnd::Kept {
                        remaining: remaining.get(),
                    })
                }
                Err(LockError::NotHeld { .. }) => {
                    tracing::warn!("the store no longer held this lease");
                    Ok(HoldEnd::NotHeld)
                }
                Err(e) => {
                    crate::metrics::store_error(&self.held.tags, &e);
                    tracing::warn!(error = %e, "setting the remaining time failed; the lock expires after its TTL");
                    Err(e)
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Runs `work` while the lease holds: its output, or
    /// [`LockError::Lost`] (and `work` dropped) the moment the lease is lost.
    pub(crate) async fn while_held<T>(
        &self,
        work: impl Future<Output = T>,
    ) -> Result<T, LockError> {
        let fence = self.fencing_token();
        tokio::select! {
            biased;
            reason = self.lost() => Err(LockError::Lost { name: self.name(), fence, reason }),
            value = work => Ok(value),
        }
    }
}

/// How [`LockGuard::release_no_sooner_than`] ended a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldEnd {
    /// The time asked for had passed: the lock was released.
    Released,
    /// The store keeps the name taken for `remaining` more, counted from
    /// when it handled the call, then frees it.
    Kept {
        /// The remaining time the store was given.
        remaining: Duration,
    },
    /// The store no longer held this lease (it expired or was taken):
    /// nothing was changed.
    NotHeld,
}

impl From<ReleaseOutcome> for HoldEnd {
    fn from(outcome: ReleaseOutcome) -> Self {
        match outcome {
            ReleaseOutcome::Released => HoldEnd::Released,
            ReleaseOutcome::NotHeld => HoldEnd::NotHeld,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.held.stop_holding();
        release_in_background(&self.held);
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.held.lease())
            .field("held", &self.is_held())
            .field("loss_reason", &self.loss_reason())
            .finish()
    }
}
