//! `MultiGuard`: several locks held together, all of them or none.
//!
//! [`Locker::acquire_all`](crate::Locker::acquire_all) takes the names one
//! by one in one canonical order (sorted), each through the usual wait loop
//! and its store's wake-ups, under one deadline. Two callers asking for the
//! same names in any order take them in the same order, so they never wait
//! on each other in a cycle. A timeout, an error or `try_acquire_all`
//! finding a name held releases what was taken before it returns; a
//! dropped (cancelled) acquire drops its guards, which release in the
//! background. Each member keeps its own lease, fence and renewal (batched
//! with the locker's other leases); the whole is lost as soon as any member
//! is.

use std::fmt;

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{FencingToken, LockError, LockGuard, LockName, LossReason, ReleaseOutcome};

/// Several locks held together (see [`Locker::acquire_all`](crate::Locker::acquire_all)).
///
/// Pass each resource the fence of its own name
/// ([`fencing_token`](Self::fencing_token)). Dropping it releases every
/// member in the background, as dropping a [`LockGuard`] does.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lockcore::{Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// // Any order: both callers below take "accounts/alice" first.
/// let transfer = locker.acquire_all(["accounts/bob", "accounts/alice"]).await?;
/// let alice = transfer.fencing_token("accounts/alice").expect("a member");
/// let bob = transfer.fencing_token("accounts/bob").expect("a member");
/// // ... debit alice with fence `alice`, credit bob with fence `bob` ...
/// # let _ = (alice, bob);
/// assert!(locker.try_acquire_all(["accounts/alice", "accounts/carol"]).await?.is_none());
/// transfer.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a MultiGuard releases its locks in the background; keep it while you act"]
pub struct MultiGuard {
    /// The members, in the order they were taken (sorted by name).
    guards: Vec<LockGuard>,
    /// Cancelled once any member is lost.
    any_lost: CancellationToken,
    /// Stops the task that watches the members when the guard goes.
    _watching: DropGuard,
}

impl MultiGuard {
    /// Holds `guards` (taken in canonical order) together. Must be called
    /// inside a tokio runtime: a task watches the members' losses.
    pub(crate) fn new(guards: Vec<LockGuard>) -> MultiGuard {
        let any_lost = CancellationToken::new();
        let done = CancellationToken::new();
        let losses: Vec<CancellationToken> = guards.iter().map(LockGuard::lost_token).collect();
        let (fire, until) = (any_lost.clone(), done.clone());
        tokio::spawn(async move {
            let first = losses.iter().map(|t| Box::pin(t.cancelled()));
            tokio::select! {
                _ = until.cancelled() => {}
                _ = futures_util::future::select_all(first) => fire.cancel(),
            }
        });
        MultiGuard {
            guards,
            any_lost,
            _watching: done.drop_guard(),
        }
    }

    /// The names held, sorted.
    pub fn names(&self) -> Vec<LockName> {
        self.guards.iter().map(LockGuard::name).collect()
    }

    /// The fencing token of `name`'s grant, if it is a member.
    pub fn fencing_token(&self, name: &str) -> Option<FencingToken> {
        self.member(name).map(LockGuard::fencing_token)
    }

    /// Every member's name and fencing token, sorted by name.
    pub fn fencing_tokens(&self) -> Vec<(LockName, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.name(), g.fencing_token()))
            .collect()
    }

    /// The member guard of `name`.
    pub fn member(&self, name: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|g| g.name().as_str() == name)
    }

    /// The member guards, sorted by name.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether every member is still held. Check it right before acting.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Every member's fencing token, if every member is still held.
    ///
    /// # Errors
    /// [`LockError::Lost`] for the first member (in name order) that is lost.
    pub fn ensure_held(&self) -> Result<Vec<(LockName, FencingToken)>, LockError> {
        self.guards
            .iter()
            .map(|g| g.ensure_held().map(|fence| (g.name(), fence)))
            .collect()
    }

    /// Which member was lost first, and why, once one is. (When several
    /// are lost at once, the first in name order.)
    pub fn loss(&self) -> Option<(LockName, LossReason)> {
        self.guards
            .iter()
            .find_map(|g| g.loss_reason().map(|reason| (g.name(), reason)))
    }

    /// Completes when any member is lost, with its name and why. Use it in
    /// `tokio::select!` to stop work the moment the locks are not all held.
    pub async fn lost(&self) -> (LockName, LossReason) {
        self.any_lost.cancelled().await;
        match self.loss() {
            Some(loss) => loss,
            // A member whose deadline passed before its renewer noticed.
            None => {
                let first = self.guards.iter().find(|g| !g.is_held());
                let name = first.unwrap_or(&self.guards[0]).name();
                (name, LossReason::DeadlinePassed)
            }
        }
    }

    /// A token cancelled once any member is lost, to hand to other tasks.
    /// Cancelling it yourself does not affect the guard.
    pub fn lost_token(&self) -> CancellationToken {
        self.any_lost.child_token()
    }

    /// Releases every member (each is tried, whatever the others answer).
    ///
    /// # Errors
    /// The first store error; the members it hit expire after their TTL.
    pub async fn release(self) -> Result<Vec<(LockName, ReleaseOutcome)>, LockError> {
        let mut outcomes = Vec::with_capacity(self.guards.len());
        let mut first_error = None;
        for guard in self.guards {
            let name = guard.name();
            match guard.release().await {
                Ok(outcome) => outcomes.push((name, outcome)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(outcomes),
        }
    }

    /// The member guards, to keep or release one by one.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("members", &self.guards)
            .field("held", &self.is_held())
            .finish()
    }
}
