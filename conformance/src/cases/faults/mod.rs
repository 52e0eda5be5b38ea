//! T3: network and store faults. A fault proxy between one client and the
//! store cuts, delays or resets its traffic; a private store is killed or
//! paused. What must hold: a holder's `lost()` fires by its local deadline,
//! nobody else is granted the lock before that deadline, fences keep growing
//! (across a crash too), and the fenced resource refuses the old holder.
//!
//! These cases need the `stores` feature, a factory exposing its store
//! ([`Factory::store`](crate::Factory::store)), proxied clients
//! ([`Factory::client_via`](crate::Factory::client_via)) and, for crash and
//! pause, a private store ([`Factory::private`](crate::Factory::private));
//! without them they skip and say which is missing.

#[cfg(feature = "stores")]
mod network;
#[cfg(feature = "stores")]
mod replies;
#[cfg(feature = "stores")]
mod store;
#[cfg(feature = "stores")]
mod support;

#[cfg(not(feature = "stores"))]
pub use imp::*;
#[cfg(feature = "stores")]
pub use network::{
    partitioned_holder_is_fenced_out, reset_mid_hold_keeps_or_reports, slow_renewal_counts_as_lost,
};
#[cfg(feature = "stores")]
pub use replies::{
    dropped_attempt_leaves_no_phantom, late_grant_counts_from_the_waiters_request,
    lost_acquire_reply_leaves_no_phantom, lost_release_reply_frees_within_ttl,
};
#[cfg(feature = "stores")]
pub use store::{fences_survive_store_crash, store_pause_keeps_invariants};
#[cfg(feature = "stores")]
pub(crate) use support::{check_takeover, fault_ttl, joined, poll_for, proxied, wait_for};

#[cfg(not(feature = "stores"))]
mod imp {
    use crate::{CaseResult, Ctx, skip};

    const WHY: &str =
        "fault cases need lock-conformance's `stores` feature (fault proxy, process control)";

    /// T3.1 (see the `stores` feature).
    pub async fn partitioned_holder_is_fenced_out(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.4 (see the `stores` feature).
    pub async fn slow_renewal_counts_as_lost(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.5 (see the `stores` feature).
    pub async fn reset_mid_hold_keeps_or_reports(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.2 (see the `stores` feature).
    pub async fn lost_acquire_reply_leaves_no_phantom(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.3 (see the `stores` feature).
    pub async fn lost_release_reply_frees_within_ttl(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.6 (see the `stores` feature).
    pub async fn fences_survive_store_crash(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.7 (see the `stores` feature).
    pub async fn store_pause_keeps_invariants(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.12 (see the `stores` feature).
    pub async fn late_grant_counts_from_the_waiters_request(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.13 (see the `stores` feature).
    pub async fn dropped_attempt_leaves_no_phantom(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
}
