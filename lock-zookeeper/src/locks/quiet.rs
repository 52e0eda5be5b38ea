//! Taking a lock nobody else touched since our last grant, without listing
//! its queue: the sequence proof.
//!
//! Under one parent node, every sequential child gets a larger sequence
//! number than every child created before it: ZooKeeper numbers it with the
//! count of children created under the parent so far (deletions leave that
//! count alone; the `cversion` clients see counts both). So if this session
//! was granted node `s`, deleted it, and its next create under the same
//! parent gets exactly `s + 1`, nobody created a node in between: the nodes
//! ahead of `s` were gone when `s` was granted (nodes never come back), `s`
//! itself is gone, and the new node is first. No listing needed.
//!
//! That holds for one *incarnation* of the parent. A container parent that
//! was deleted (while empty) and created again numbers from 0, so `s + 1`
//! proves nothing there. The session keeps a data watch on the parent (set
//! once, pipelined before a create; child changes do not trigger it), and
//! `s` vouches only under a watch that was set before `s` was created or
//! while it existed, so on the parent that held `s`. The watch fires when
//! that parent is deleted. ZooKeeper sends the event on the connection before
//! the reply to any request applied after the deletion, and the client hands
//! the event to its watcher before handing out later replies; so when the
//! reply to the next create arrives, a deletion before it has been seen.
//!
//! The proof is only used when the watch has not fired, the connection never
//! broke since the session last looked (watch events during a reconnection
//! come from re-registration, which this does not rely on), and the vouched
//! number is younger than the session timeout (sequence numbers are 32-bit;
//! they cannot wrap in that time). Otherwise, and whenever the create gets
//! another number, the queue is listed as before.

use std::collections::HashMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

/// How many parents a session keeps a watch on. Past that, new lock names
/// are simply listed every time.
const MAX_PARENTS: usize = 1024;

/// What one session knows about the queues it uses.
pub(crate) struct QuietQueues {
    state: Mutex<State>,
    /// How long a vouched sequence number stays usable.
    fresh_for: Duration,
    /// How many parents it watches at most.
    capacity: usize,
}

struct State {
    parents: HashMap<String, Parent>,
    /// The session's connection state, to notice a reconnection.
    link: zk::StateWatcher,
    last_id: u64,
}

type Fired = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// A parent under watch.
struct Parent {
    id: u64,
    fired: Fired,
    /// The sequence number our next create gets if nobody else created a
    /// node since our last grant here, and when that grant's node was
    /// deleted.
    next: Option<(u32, Instant)>,
}

/// A vouched sequence number, taken by one create.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    id: u64,
    next: u32,
}

impl Claim {
    /// The parent watch this claim relies on.
    pub(crate) fn watch(self) -> u64 {
        self.id
    }
}

impl QuietQueues {
    pub(crate) fn new(client: &zk::Client, session_timeout: Duration) -> QuietQueues {
        Self::with_capacity(client, session_timeout, MAX_PARENTS)
    }

    fn with_capacity(client: &zk::Client, fresh_for: Duration, capacity: usize) -> QuietQueues {
        QuietQueues {
            state: Mutex::new(State {
                parents: HashMap::new(),
                link: client.state_watcher(),
                last_id: 0,
            }),
            fresh_for,
            capacity,
        }
    }

    /// The state, after forgetting everything if the connection state changed
    /// and every parent whose watch fired.
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if ready(pin!(state.link.changed())) {
            state.parents.clear();
        }
        state
    }

    /// The id of the watch on `parent`, if one is set and has not fired: a
    /// create sent from now on is applied after the watch was set.
    pub(crate) fn watched(&self, parent: &str) -> Option<u64> {
        let mut state = self.lock();
        live(&mut state, parent).map(|p| p.id)
    }

    /// Whether a watch on `parent` should be set (none yet, and room).
    pub(crate) fn wants_watch(&self, parent: &str) -> bool {
        let mut state = self.lock();
        if live(&mut state, parent).is_some() {
            return false;
        }
        if state.parents.len() >= self.capacity {
            state.parents.retain(|_, p| !ready(p.fired.as_mut()));
        }
        state.parents.len() < self.capacity
    }

    /// Records the watch an `exists` on `parent` set; its id if the parent
    /// existed (a watch on a missing node proves nothing).
    pub(crate) fn watching(
        &self,
        parent: &str,
        exists: Result<(Option<zk::Stat>, zk::OneshotWatcher), zk::Error>,
    ) -> Option<u64> {
        let Ok((Some(_), watcher)) = exists else {
            return None;
        };
        let mut state = self.lock();
        if let Some(current) = live(&mut state, parent) {
            // Set by another attempt before now: before our create, or while
            // our node was there. Just as good.
            return Some(current.id);
        }
        state.last_id = state.last_id.wrapping_add(1);
        let id = state.last_id;
        state.parents.insert(
            parent.to_owned(),
            Parent {
                id,
                fired: Box::pin(watcher.changed()),
                next: None,
            },
        );
        Some(id)
    }

    /// Takes the vouched sequence number of `parent`, if any (one create
    /// may use it).
    pub(crate) fn claim(&self, parent: &str) -> Option<Claim> {
        let fresh_for = self.fresh_for;
        let mut state = self.lock();
        let p = live(&mut state, parent)?;
        let (next, since) = p.next.take()?;
        (since.elapsed() < fresh_for).then_some(Claim { id: p.id, next })
    }

    /// Whether a create that used `claim` and got `sequence` is first in
    /// line: the vouched number, and the watch still quiet now that the
    /// create's reply is in.
    pub(crate) fn proves_first(&self, parent: &str, claim: Claim, sequence: u32) -> bool {
        let mut state = self.lock();
        sequence == claim.next && live(&mut state, parent).is_some_and(|p| p.id == claim.id)
    }

    /// After our grant `sequence` under `parent` was deleted (the delete
    /// answered): the next create there is first if it gets `sequence + 1`.
    /// `watch`: the watch that was set before that grant's create.
    pub(crate) fn vouch(&self, parent: &str, watch: u64, sequence: u32) {
        let mut state = self.lock();
        if let Some(p) = live(&mut state, parent).filter(|p| p.id == watch) {
            p.next = Some((sequence.wrapping_add(1), Instant::now()));
        }
    }
}

/// The watch on `parent`, dropped if it fired.
fn live<'s>(state: &'s mut State, parent: &str) -> Option<&'s mut Parent> {
    if ready(state.parents.get_mut(parent)?.fired.as_mut()) {
        state.parents.remove(parent);
        return None;
    }
    state.parents.get_mut(parent)
}

/// Polls `future` once: whether it has completed (its event has arrived).
fn ready<F: Future + ?Sized>(future: Pin<&mut F>) -> bool {
    future
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
}

impl std::fmt::Debug for QuietQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("QuietQueues")
            .field("watched", &state.parents.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watches a session keeps stay bounded: past its capacity, a new
    /// parent gets no watch (it is listed every time) until a watched parent
    /// is deleted, which frees its place. A vouched number is used once, and
    /// only with the watch it was vouched under.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watches_stay_bounded_and_a_deleted_parent_frees_its_place() {
        let store = lock_conformance::kit::stores::zookeeper::shared();
        let client = zk::Client::connect(&store.endpoint()).await.unwrap();
        let quiet = QuietQueues::with_capacity(&client, Duration::from_secs(60), 2);
        let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let base = format!("/zk-unit-quiet-{}", uuid::Uuid::new_v4().simple());
        let parents: Vec<String> = (0..3).map(|i| format!("{base}-{i}")).collect();
        let mut ids = Vec::new();
        for parent in &parents[..2] {
            client.create(parent, &[], &open).await.unwrap();
            assert!(quiet.wants_watch(parent));
            let id = quiet.watching(parent, client.check_and_watch_stat(parent).await);
            ids.push(id.expect("an existing parent is watched"));
            assert!(!quiet.wants_watch(parent), "one watch per parent");
        }
        client.create(&parents[2], &[], &open).await.unwrap();
        assert!(!quiet.wants_watch(&parents[2]), "full");

        quiet.vouch(&parents[0], ids[0], 41);
        let claim = quiet.claim(&parents[0]).expect("vouched");
        assert!(quiet.claim(&parents[0]).is_none(), "taken once");
        assert!(!quiet.proves_first(&parents[0], claim, 43));
        assert!(quiet.proves_first(&parents[0], claim, 42));
        quiet.vouch(&parents[0], ids[1], 41);
        assert!(quiet.claim(&parents[0]).is_none(), "another parent's watch");

        quiet.vouch(&parents[0], ids[0], 41);
        let claim = quiet.claim(&parents[0]).unwrap();
        client.delete(&parents[0], None).await.unwrap();
        // The deletion's event is in before any later reply.
        client.check_stat(&parents[2]).await.unwrap();
        assert!(!quiet.proves_first(&parents[0], claim, 42), "watch fired");
        assert!(
            quiet.wants_watch(&parents[2]),
            "the deleted parent's place is free"
        );
        for parent in &parents[1..] {
            client.delete(parent, None).await.unwrap();
        }
    }
}
