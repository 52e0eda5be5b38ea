//! Hand-off grants: a release hands the free lock straight to the head of
//! the line, in the same script, on the waiter's standing offer (see
//! `scripts/handoff.lua`). The waiter's lease counts from its own send of
//! the attempt whose offer the store used, never from the message's
//! arrival, so a late message cannot stretch it.

use std::time::Duration;

use lockcore::Lease;
use lockcore::backend::Moment;

use crate::connection::client::Client;
use crate::connection::script::Call;
use crate::keys::Keys;
use crate::wait::notify::HoldWatch;

/// A waiting acquire's part in one attempt: its member in the line, how
/// long the line is kept without a refresh, and the attempt's number in
/// the wait (its standing offer's `seq`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct InLine<'a> {
    pub(crate) member: &'a str,
    pub(crate) linger: Duration,
    pub(crate) seq: u64,
}

impl Client {
    /// Appends the hand-off's keys and its lock delay argument to a script
    /// that frees or claims a lock (`grant_from_tail`). The argument is ''
    /// (no hand-off grant, waiters claim as before) where the releasing
    /// script cannot promise the grant to the waiter: on a Redis Cluster (a
    /// waiter may listen on another node, where a message count of 0 says
    /// nothing) and in the lossless mode (a grant is used only once the
    /// replicas acknowledged it, which the waiter cannot see).
    pub(crate) fn handoff_tail(&self, call: &mut Call, keys: &Keys) {
        call.0.key(&keys.offers).key(&keys.fence);
        call.0.key(&keys.floor).key(&keys.era);
        if self.commands.is_cluster() || self.failover.lossless() {
            call.0.arg("");
        } else {
            call.0.arg(self.failover.script_arg());
        }
    }

    /// `lease`, just granted, with its loss signal: evictions heard by
    /// `watch` (registered before the grant could exist) and failovers.
    pub(crate) fn with_watch(&self, lease: Lease, watch: HoldWatch) -> Lease {
        let lost = watch.granted(lease.fence(), self.failover.era.loss_signal());
        lease.with_loss_signal(lost).with_extension(watch)
    }
}

/// The moment `by` before `sent`: a lease found already handed over, with
/// `ttl - by` left in the store, counts as if sent then, so its local
/// deadline is `sent` plus what the store has left. `None` if the
/// monotonic clock cannot go back that far.
pub(crate) fn backdated(sent: Moment, by: Duration) -> Option<Moment> {
    let mono = sent.mono().checked_sub(by)?;
    Some(Moment::from_parts(
        mono,
        sent.boot().map(|b| b.saturating_sub(by)),
    ))
}
