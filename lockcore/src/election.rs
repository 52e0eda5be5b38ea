//! `Election`: one leader at a time, with fenced terms.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::backend::Kind;

use crate::{
    FencingToken, Holder, HolderLabel, LockError, LockGuard, LockName, Locker, LossReason,
    ReleaseOutcome,
};

/// Leader election on one name.
///
/// A leader is the holder of the election's lock, so it has everything a
/// lock has: a lease that renews itself, [`lost`](Leadership::lost) the
/// moment it is gone, and a fencing token, here called the *term*, strictly
/// increasing across successive leaders (and as durable as the backend's
/// fences). A leader paused past its lease that wakes up has a stale term:
/// resources that check terms refuse its writes, which is what prevents two
/// leaders from acting at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lockcore::{HolderLabel, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let election = locker.election("scheduler")?;
/// let mut observer = election.observe();
/// let leadership = election.campaign(HolderLabel::new("node-a")?).await?;
/// let seen = observer.next().await.expect("an observation")?.expect("a leader");
/// assert_eq!(seen.term, leadership.term());
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    locker: Locker,
    name: LockName,
}

/// The current leader, as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: its fencing token.
    pub term: FencingToken,
    /// The label the leader campaigned with.
    pub label: Option<HolderLabel>,
}

impl From<Holder> for Leader {
    fn from(holder: Holder) -> Self {
        Leader {
            term: holder.fence,
            label: holder.label,
        }
    }
}

impl Election {
    pub(crate) fn new(locker: Locker, name: LockName) -> Self {
        Election { locker, name }
    }

    /// The election's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Waits until this candidate leads (however long that takes), and
    /// returns its leadership. Dropping the future withdraws the candidacy.
    ///
    /// # Errors
    /// Invalid configuration, or a store error that retrying did not fix.
    pub async fn campaign(&self, label: HolderLabel) -> Result<Leadership, LockError> {
        let locker = self.locker.clone().label(label.clone());
        loop {
            match locker.acquire_timeout(&self.name, Locker::MAX_WAIT).await {
                Ok(guard) => return Ok(Leadership { guard, label }),
                Err(LockError::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The current leader, if any.
    ///
    /// # Errors
    /// A store error.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        Ok(self.locker.inspect(&self.name).await?.map(Leader::from))
    }

    /// Follows the leadership without campaigning: the first
    /// [`Observer::next`] yields the current leader (or `None`), and each
    /// later one the next change, woken by the store where it notifies and
    /// at least every re-check interval.
    ///
    /// Store wake-ups say "the lock may have become free", never "granted":
    /// a new leader is seen at the next look after its grant (while the seat
    /// is vacant the observer looks again after 10 ms, doubling up to the
    /// re-check interval), so a leadership shorter than that can go
    /// unobserved. Terms still only grow.
    pub fn observe(&self) -> Observer {
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(follow(self.locker.clone(), self.name.clone(), tx));
        Observer { rx, task }
    }
}

/// What [`Election::observe`] yields.
#[derive(Debug)]
pub struct Observer {
    rx: mpsc::Receiver<Result<Option<Leader>, LockError>>,
    task: JoinHandle<()>,
}

impl Observer {
    /// The next leader change (`Ok(None)`: no leader), or a store error.
    /// `None` once observing stopped.
    pub async fn next(&mut self) -> Option<Result<Option<Leader>, LockError>> {
        self.rx.recv().await
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The observer task: inspect after arming a wake-up, report changes.
async fn follow(
    locker: Locker,
    name: LockName,
    tx: mpsc::Sender<Result<Option<Leader>, LockError>>,
) {
    let backend = locker.backend().clone();
    let recheck = locker.get_recheck();
    // While the seat is vacant, look again soon and then less often: a new
    // leader's grant wakes nobody.
    let vacant = crate::Backoff::new(Duration::from_millis(10), recheck).multiplier(2.0);
    let mut vacant_looks: u32 = 0;
    let mut last: Option<Option<Leader>> = None;
    loop {
        let wakeup = backend.watch(&name, Kind::Lock).await.ok().flatten();
        let seen = match backend.holders(&name, Kind::Lock).await {
            Ok(holders) => holders.into_iter().next(),
            Err(e) => {
                if tx.send(Err(e)).await.is_err() {
                    return;
                }
                tokio::time::sleep(recheck).await;
                continue;
            }
        };
        let expires_in = seen.as_ref().and_then(|h| h.expires_in);
        let leader = seen.map(Leader::from);
        let led = leader.is_some();
        if last.as_ref() != Some(&leader) {
            if tx.send(Ok(leader.clone())).await.is_err() {
                return;
            }
            last = Some(leader);
        }
        // Expiry sends no message on most stores: look again right after it.
        let pause = match (led, expires_in) {
            (false, _) => {
                vacant_looks = vacant_looks.saturating_add(1);
                vacant.ceiling(vacant_looks - 1)
            }
            (true, Some(d)) => (d + Duration::from_millis(1)).min(recheck),
            (true, None) => recheck,
        };
        if led {
            vacant_looks = 0;
        }
        match wakeup {
            Some(wakeup) => {
                tokio::select! {
                    _ = wakeup => {}
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            None => tokio::time::sleep(pause).await,
        }
    }
}

/// Being the leader. Dropping it resigns in the background.
#[derive(Debug)]
#[must_use = "dropping a Leadership resigns in the background"]
pub struct Leadership {
    guard: LockGuard,
    label: HolderLabel,
}

impl Leadership {
    /// This leadership's term: pass it to every resource the leader writes.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The label this leader campaigned with.
    pub fn label(&self) -> &HolderLabel {
        &self.label
    }

    /// Whether this candidate still leads. Check it right before acting.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Completes when the leadership is lost, with the reason.
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// The lock guard behind the leadership.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Steps down: releases the election's lock so another candidate leads.
    ///
    /// # Errors
    /// A store error; the leadership then ends when its lease expires.
    pub async fn resign(self) -> Result<ReleaseOutcome, LockError> {
        self.guard.release().await
    }
}
