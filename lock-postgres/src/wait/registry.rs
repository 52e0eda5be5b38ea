//! What one backend instance's waiters and holders registered with its
//! listener task (see `wait/notify.rs` for what it is for): waiters per topic,
//! grants that may be evicted, and which `LISTEN`s and watch keys are in
//! effect on the listener connection, under one lock, so a waiter or holder
//! that registers sees the state as the task left it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use lockcore::backend::CancellationToken;

use lockcore::backend::Era;
use tokio::sync::Notify;

use crate::keys;
use uuid::Uuid;

/// The registry of one backend instance, shared with its listener task.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Every grant's loss signal is a child of the current era's token:
    /// closing the backend, or a failover, fires them all.
    era: Arc<Era>,
}

struct State {
    /// Waiters per topic (a lock name, or a semaphore's; see `keys::topic`).
    waiters: HashMap<String, Waiters>,
    /// `LISTEN` on the wake-up channel is in effect.
    listening: bool,
    /// Topics whose watch key the listener connection holds (shared): a
    /// release of such a topic notifies. Kept until the task lets go.
    watched: HashSet<String>,
    holders: HashMap<Uuid, Grant>,
    /// The eviction `LISTEN` in effect, numbered anew each time it starts
    /// (notifications before it are lost).
    evictions: Option<u64>,
    /// Bumped whenever a held grant may not be covered by that `LISTEN`.
    checks_wanted: u64,
}

struct Waiters {
    notify: Arc<Notify>,
    count: usize,
}

/// A grant this instance holds, or an acquire that may get one.
struct Grant {
    name: String,
    /// `None` while the acquire is in flight.
    fence: Option<i64>,
    /// An eviction of this owner seen while the acquire was in flight.
    evicted: Option<i64>,
    /// The eviction `LISTEN` that covers this grant: in effect before its
    /// acquire was sent, or before it was last checked against the table.
    covered_by: Option<u64>,
    lost: CancellationToken,
}

impl Shared {
    pub(crate) fn new(era: Arc<Era>) -> Self {
        Shared {
            era,
            state: Mutex::new(State {
                waiters: HashMap::new(),
                listening: false,
                watched: HashSet::new(),
                holders: HashMap::new(),
                evictions: None,
                checks_wanted: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Updates are single map operations; a panic cannot leave it torn.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- waiters ----

    /// Registers a waiter of `topic`: the notification it waits on, and
    /// whether `LISTEN` and the topic's watch key were in effect then.
    pub(crate) fn register(&self, topic: &str) -> (Arc<Notify>, bool) {
        let mut state = self.lock();
        let ready = state.listening && state.watched.contains(topic);
        let entry = state
            .waiters
            .entry(topic.to_owned())
            .or_insert_with(|| Waiters {
                notify: Arc::new(Notify::new()),
                count: 0,
            });
        entry.count += 1;
        (entry.notify.clone(), ready)
    }

    /// Undoes one [`register`](Self::register); `true` when that was the
    /// topic's last waiter and its watch key is held (the task may let go).
    pub(crate) fn unregister(&self, topic: &str) -> bool {
        let mut state = self.lock();
        let Some(entry) = state.waiters.get_mut(topic) else {
            return false;
        };
        entry.count -= 1;
        if entry.count > 0 {
            return false;
        }
        state.waiters.remove(topic);
        state.watched.contains(topic)
    }

    /// Waiters currently registered, over all topics.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiters.values().map(|w| w.count).sum()
    }

    /// Wakes one waiter of `topic` (every one for a reader-writer lock,
    /// see `keys::wakes_all`); `false` when this instance waits for nothing
    /// at all (the notification was of no use to it).
    pub(crate) fn wake(&self, topic: &str) -> bool {
        let state = self.lock();
        if let Some(waiters) = state.waiters.get(topic) {
            if keys::wakes_all(topic) {
                waiters.notify.notify_waiters();
            } else {
                waiters.notify.notify_one();
            }
        }
        !state.waiters.is_empty()
    }

    /// The connection is gone (and every `LISTEN` and watch key with it):
    /// every waiter re-checks, it may have missed a release.
    pub(crate) fn lost(&self) {
        let mut state = self.lock();
        state.listening = false;
        state.watched.clear();
        state.evictions = None;
        state.checks_wanted += 1;
        for waiters in state.waiters.values() {
            waiters.notify.notify_waiters();
        }
    }

    pub(crate) fn set_listening(&self, listening: bool) {
        self.lock().listening = listening;
    }

    /// Stops counting as listening if nobody waits; true if so.
    pub(crate) fn stop_listening_if_idle(&self) -> bool {
        let mut state = self.lock();
        if state.waiters.is_empty() {
            state.listening = false;
        }
        !state.listening
    }

    /// Whether `topic` has waiters but its watch key is not held.
    pub(crate) fn wants_watch(&self, topic: &str) -> bool {
        let state = self.lock();
        state.waiters.contains_key(topic) && !state.watched.contains(topic)
    }

    pub(crate) fn set_watched(&self, topic: &str) {
        self.lock().watched.insert(topic.to_owned());
    }

    /// Whether `topic` is watched and nobody waits for it any more: if so,
    /// it no longer counts as watched (the caller lets go of its key).
    pub(crate) fn unwatch_if_idle(&self, topic: &str) -> bool {
        let mut state = self.lock();
        if state.waiters.contains_key(topic) {
            return false;
        }
        state.watched.remove(topic)
    }

    /// `(listening, listening for evictions, grants registered)`, for Debug.
    pub(crate) fn status(&self) -> (bool, bool, usize) {
        let state = self.lock();
        (
            state.listening,
            state.evictions.is_some(),
            state.holders.len(),
        )
    }

    // ---- holders ----

    /// Registers the grant an acquire of `name` by `owner` may get; `true`
    /// when the eviction `LISTEN` already covers it.
    pub(crate) fn expect(&self, name: &str, owner: Uuid) -> bool {
        let mut state = self.lock();
        let covered_by = state.evictions;
        state.holders.insert(
            owner,
            Grant {
                name: name.to_owned(),
                fence: None,
                evicted: None,
                covered_by,
                lost: self.era.loss_signal(),
            },
        );
        covered_by.is_some()
    }

    /// The acquire of `owner` got `fence`: its loss signal (already
    /// cancelled if an eviction of it arrived first), and whether the
    /// eviction `LISTEN` covers it (if not, the task must check it).
    pub(crate) fn granted(&self, owner: Uuid, fence: i64) -> (CancellationToken, bool) {
        let mut state = self.lock();
        let evictions = state.evictions;
        let (lost, covered) = match state.holders.get_mut(&owner) {
            Some(grant) => {
                grant.fence = Some(fence);
                if grant.evicted == Some(fence) {
                    grant.lost.cancel();
                }
                (
                    grant.lost.clone(),
                    evictions.is_some() && grant.covered_by == evictions,
                )
            }
            None => (self.era.loss_signal(), true),
        };
        if !covered {
            state.checks_wanted += 1;
        }
        (lost, covered)
    }

    /// Forgets the grant of `owner`; `true` if this instance now holds none.
    pub(crate) fn forget(&self, owner: Uuid) -> bool {
        let mut state = self.lock();
        state.holders.remove(&owner).is_some() && state.holders.is_empty()
    }

    pub(crate) fn holding(&self) -> bool {
        !self.lock().holders.is_empty()
    }

    pub(crate) fn set_evictions(&self, epoch: Option<u64>) {
        let mut state = self.lock();
        state.evictions = epoch;
        state.checks_wanted += 1;
    }

    pub(crate) fn checks_wanted(&self) -> u64 {
        self.lock().checks_wanted
    }

    /// An eviction notice `fence owner name`: cancels the matching grant's
    /// loss signal (or remembers it for an acquire still in flight).
    pub(crate) fn evicted(&self, payload: &str) {
        let mut parts = payload.splitn(3, ' ');
        let (Some(fence), Some(owner), Some(name)) = (
            parts.next().and_then(|f| f.parse::<i64>().ok()),
            parts.next().and_then(|o| Uuid::parse_str(o).ok()),
            parts.next(),
        ) else {
            tracing::debug!(%payload, "ignoring a malformed eviction notice");
            return;
        };
        let mut state = self.lock();
        let Some(grant) = state.holders.get_mut(&owner) else {
            return;
        };
        if grant.name != name {
            return;
        }
        match grant.fence {
            Some(held) if held == fence => grant.lost.cancel(),
            Some(_) => {}
            None => grant.evicted = Some(fence),
        }
    }

    /// Held grants the eviction `LISTEN` number `epoch` does not cover yet:
    /// `(owner, name, fence)`.
    pub(crate) fn uncovered(&self, epoch: u64) -> Vec<(Uuid, String, i64)> {
        self.lock()
            .holders
            .iter()
            .filter(|(_, g)| g.covered_by != Some(epoch))
            .filter_map(|(owner, g)| Some((*owner, g.name.clone(), g.fence?)))
            .collect()
    }

    /// After checking `checked` against the table with `LISTEN` number
    /// `epoch` in effect: signals those `gone`, and counts the rest covered.
    pub(crate) fn checked(&self, epoch: u64, checked: &[(Uuid, String, i64)], gone: &[Uuid]) {
        let mut state = self.lock();
        for (owner, _, fence) in checked {
            if let Some(grant) = state.holders.get_mut(owner)
                && grant.fence == Some(*fence)
            {
                if gone.contains(owner) {
                    grant.lost.cancel();
                }
                grant.covered_by = Some(epoch);
            }
        }
    }
}
