//! The incarnations of a replicated store, as one backend instance saw them.
//!
//! A store with asynchronous replication can fail over to a replica that
//! lacks the last writes: a lease granted just before may be gone on the
//! promoted server, and another client granted the name while its holder
//! still works. Each server names its incarnation (PostgreSQL its WAL
//! timeline, Redis its replication id); a backend that sees the name change
//! cannot tell which of its leases survived, so all of them are lost.
//!
//! [`Era`] keeps that bookkeeping once for every adapter: each lease's loss
//! signal is a child of the current era's token, a new incarnation ends the
//! era (firing every earlier lease's loss at once), and a lock delay holds
//! this instance's grants until the old primary's leases have run out.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The leases of one store incarnation, and the lock delay after a failover.
#[derive(Debug)]
pub struct Era {
    closing: CancellationToken,
    state: Mutex<EraState>,
}

#[derive(Debug)]
struct EraState {
    token: CancellationToken,
    /// The incarnation this backend last saw, once it saw one.
    incarnation: Option<String>,
    /// No grant before this (a failover's lock delay).
    grants_from: Option<Instant>,
}

impl Era {
    /// The first era; `closing` (the backend's) ends every era.
    pub fn new(closing: CancellationToken) -> Era {
        Era {
            state: Mutex::new(EraState {
                token: closing.child_token(),
                incarnation: None,
                grants_from: None,
            }),
            closing,
        }
    }

    /// A loss signal for a lease granted from now on: it fires when the
    /// era ends (or the backend closes).
    pub fn loss_signal(&self) -> CancellationToken {
        self.lock().token.child_token()
    }

    /// The store named its incarnation `incarnation`: when it is not the
    /// one this backend saw before, every lease granted before is lost
    /// (their loss signals fire) and this returns `true`.
    pub fn saw(&self, incarnation: &str) -> bool {
        let mut state = self.lock();
        let changed = state
            .incarnation
            .as_deref()
            .is_some_and(|seen| seen != incarnation);
        if changed {
            state.token.cancel();
            state.token = self.closing.child_token();
        }
        if state.incarnation.as_deref() != Some(incarnation) {
            state.incarnation = Some(incarnation.to_owned());
        }
        changed
    }

    /// The incarnation this backend last saw.
    pub fn incarnation(&self) -> Option<String> {
        self.lock().incarnation.clone()
    }

    /// Grants nothing for `wait` from now (a lock delay); a later end
    /// already set stays.
    pub fn hold_grants(&self, wait: Duration) {
        if wait.is_zero() {
            return;
        }
        let until = Instant::now() + wait;
        let mut state = self.lock();
        state.grants_from = Some(state.grants_from.map_or(until, |t| t.max(until)));
    }

    /// How long grants still wait, if they do.
    pub fn grants_wait(&self) -> Option<Duration> {
        let from = self.lock().grants_from?;
        let left = from.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EraState> {
        // Every update under this lock is a plain assignment.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_incarnation_fires_every_earlier_loss_signal_and_no_later_one() {
        let closing = CancellationToken::new();
        let era = Era::new(closing.clone());
        let before_any = era.loss_signal();
        assert!(!era.saw("a"), "the first incarnation seen is no change");
        let first = era.loss_signal();
        assert!(!era.saw("a"));
        assert!(!before_any.is_cancelled() && !first.is_cancelled());
        assert_eq!(era.incarnation().as_deref(), Some("a"));
        assert!(era.saw("b"));
        assert!(before_any.is_cancelled() && first.is_cancelled());
        let second = era.loss_signal();
        assert!(!era.saw("b"));
        assert!(!second.is_cancelled());
        closing.cancel();
        assert!(second.is_cancelled(), "closing the backend ends every era");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_delay_holds_grants_until_its_latest_end() {
        let era = Era::new(CancellationToken::new());
        assert_eq!(era.grants_wait(), None);
        era.hold_grants(Duration::ZERO);
        assert_eq!(era.grants_wait(), None);
        era.hold_grants(Duration::from_secs(3));
        era.hold_grants(Duration::from_secs(1));
        assert_eq!(era.grants_wait(), Some(Duration::from_secs(3)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(era.grants_wait(), Some(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(era.grants_wait(), None);
    }
}
