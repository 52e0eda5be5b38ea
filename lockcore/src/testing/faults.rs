//! `Faults`: what goes wrong between a client and the store, switched on
//! and off by the test.

use std::time::Duration;

use tokio::sync::watch;

use crate::LockError;

/// The backend name in the errors the faults inject.
pub(super) const BACKEND: &str = "test";

/// The faults of one scope: one client ([`TestBackend::faults`]) or every
/// client of a store ([`TestStore::faults`]). A client suffers the faults of
/// both. Clones control the same faults; everything stays until
/// [`heal`](Self::heal) (or, for [`fail_renewals`](Self::fail_renewals),
/// until the count is used up).
///
/// Nothing here reads a clock except [`delay_replies`](Self::delay_replies),
/// which sleeps on tokio's, so under `tokio::time::pause()` a test advances
/// through the faults in no real time.
///
/// [`TestBackend::faults`]: super::TestBackend::faults
/// [`TestStore::faults`]: super::TestStore::faults
#[derive(Debug, Clone)]
pub struct Faults {
    state: std::sync::Arc<watch::Sender<State>>,
}

#[derive(Debug, Clone, Default)]
struct State {
    partitioned: bool,
    renewals: RenewalFault,
    delay: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum RenewalFault {
    #[default]
    None,
    /// Fail this many more renewal calls (`None`: until healed).
    Fail(Option<u32>),
    Hang,
}

/// What one renewal call meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RenewalAction {
    Proceed,
    Fail,
    Hang,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            state: std::sync::Arc::new(watch::Sender::new(State::default())),
        }
    }
}

impl Faults {
    /// Cuts the scope off the store: every call fails at once with
    /// [`LockError::Unavailable`] (retryable, like a refused connection)
    /// until [`heal`](Self::heal). Renewals fail too, so a holder is lost at
    /// its local deadline ([`LossReason::RenewalUnanswered`](crate::LossReason::RenewalUnanswered));
    /// the store itself keeps the lease until its TTL runs out. An eviction
    /// notice still gets through: the in-memory store pushes it in-process.
    pub fn partition(&self) {
        self.state.send_modify(|s| s.partitioned = true);
    }

    /// The next `attempts` renewal calls fail with [`LockError::Unavailable`]
    /// (retryable), then renewals succeed again: a blip the renewer rides
    /// out by retrying, as long as the lease's deadline is not reached.
    pub fn fail_renewals(&self, attempts: u32) {
        self.state
            .send_modify(|s| s.renewals = RenewalFault::Fail(Some(attempts)));
    }

    /// Every renewal call fails with [`LockError::Unavailable`] until
    /// [`heal`](Self::heal): holders are lost at their local deadline
    /// ([`LossReason::RenewalUnanswered`](crate::LossReason::RenewalUnanswered)),
    /// and the store frees the name one TTL after the last renewal.
    pub fn fail_renewals_until_healed(&self) {
        self.state
            .send_modify(|s| s.renewals = RenewalFault::Fail(None));
    }

    /// Every renewal call waits, unanswered, until [`heal`](Self::heal), then
    /// goes to the store: a slow store. Healed before the lease's local
    /// deadline, the late renewal is adopted and nothing is lost; otherwise
    /// the holder's `lost()` fires at that deadline
    /// ([`LossReason::RenewalUnanswered`](crate::LossReason::RenewalUnanswered)).
    /// There is no count: the first hung renewal already holds the lease
    /// until it is healed or the deadline passes.
    pub fn hang_renewals(&self) {
        self.state.send_modify(|s| s.renewals = RenewalFault::Hang);
    }

    /// Every call is answered `delay` after the store acted (on tokio's
    /// clock). A lease's deadline counts from the moment a renewal was sent,
    /// so a delay near the renew interval costs the lease. `Duration::ZERO`
    /// removes the delay.
    pub fn delay_replies(&self, delay: Duration) {
        self.state.send_modify(|s| s.delay = delay);
    }

    /// Removes every fault of this scope, and lets hung renewals go on to
    /// the store.
    pub fn heal(&self) {
        self.state.send_replace(State::default());
    }

    /// An error if the scope is partitioned.
    pub(super) fn reach(&self) -> Result<(), LockError> {
        if self.state.borrow().partitioned {
            return Err(LockError::unavailable(BACKEND, "partitioned by the test"));
        }
        Ok(())
    }

    /// What the next renewal call meets; a counted failure is used up.
    pub(super) fn next_renewal(&self) -> RenewalAction {
        let mut action = RenewalAction::Proceed;
        self.state.send_if_modified(|s| match s.renewals {
            RenewalFault::None => false,
            RenewalFault::Hang => {
                action = RenewalAction::Hang;
                false
            }
            RenewalFault::Fail(None) => {
                action = RenewalAction::Fail;
                false
            }
            RenewalFault::Fail(Some(0)) => {
                s.renewals = RenewalFault::None;
                true
            }
            RenewalFault::Fail(Some(left)) => {
                action = RenewalAction::Fail;
                s.renewals = RenewalFault::Fail(Some(left - 1));
                true
            }
        });
        action
    }

    /// Completes once renewals no longer hang.
    pub(super) async fn unhung(&self) {
        let mut changes = self.state.subscribe();
        // The sender lives in `self`, so the channel cannot close here.
        let _ = changes.wait_for(|s| s.renewals != RenewalFault::Hang).await;
    }

    /// How long replies are held back.
    pub(super) fn delay(&self) -> Duration {
        self.state.borrow().delay
    }
}
