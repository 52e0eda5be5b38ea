//! What `distlock run` holds while its command runs: one lock (or permit,
//! or a job's run), or several locks together (`--also`). The command runs
//! while every lease holds.

use distlock::backend::CancellationToken;
use distlock::{Lease, LockGuard, LossReason, MultiGuard};

/// What a run holds while its command runs: a lock (or permit), or
/// several locks together.
pub(crate) trait Hold {
    /// Cancelled once the hold is lost (any of its leases).
    fn lost_token(&self) -> CancellationToken;
    /// Why it was lost, once it was.
    fn loss_reason(&self) -> Option<LossReason>;
    /// Whether every lease still holds.
    fn is_held(&self) -> bool;
    /// The leases, as last renewed.
    fn leases(&self) -> Vec<Lease>;
}

impl Hold for LockGuard {
    fn lost_token(&self) -> CancellationToken {
        LockGuard::lost_token(self)
    }
    fn loss_reason(&self) -> Option<LossReason> {
        LockGuard::loss_reason(self)
    }
    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }
    fn leases(&self) -> Vec<Lease> {
        vec![self.lease()]
    }
}

impl Hold for MultiGuard {
    fn lost_token(&self) -> CancellationToken {
        MultiGuard::lost_token(self)
    }
    fn loss_reason(&self) -> Option<LossReason> {
        self.loss().map(|(_, reason)| reason)
    }
    fn is_held(&self) -> bool {
        MultiGuard::is_held(self)
    }
    fn leases(&self) -> Vec<Lease> {
        self.guards().iter().map(LockGuard::lease).collect()
    }
}
