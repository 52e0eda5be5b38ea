//! One view of a lock's queue per session, shared by every local waiter.
//!
//! A thousand waiters of one process on one name must not each keep their
//! own copy of the line and read it again on every change: memory and reads
//! would grow with the square of the waiters. A [`Line`] keeps the queue of
//! one lock for the whole session, and one task watches it for every local
//! waiter: it lists the queue when a waiter joined since the last listing
//! (waiters that join together share one; a waiter alone in the view joins
//! on the listing sent with its create), and otherwise watches the
//! node just ahead of the first local waiter (an `exists` watch, as in the
//! classic recipe). When that node goes and none is left ahead, that waiter
//! alone is told it is first; when others were ahead of it, they may have
//! gone unseen, so the queue is listed again (one round trip, not one per
//! node). To keep that listing out of the hand-off, the task also watches
//! the next node ahead of the one just ahead: when it goes (the one just
//! ahead is about to hold), the queue is listed then, so that the
//! release of the one just ahead makes the waiter first on its own. A
//! release by this session is known at once, without an event.
//! A deletion event proves the node gone: `set_remaining`, which deletes a
//! holder's node and creates it again at the same path in one transaction
//! ([`crate::locks::remaining`]), writes it first, so a watcher hears of
//! that write instead and watches again.
//!
//! **Why a decision on this view is sound.** Sequence numbers only grow, so
//! the nodes ahead of a node are older than it, and only ever leave. A
//! listing read after a node's create shows every node still ahead of it;
//! so once each of those is known gone (deleted by this session, an event,
//! or an `exists` that finds nothing), the node is first. A waiter's place
//! is judged only on a listing sent after its create was answered, and its
//! node is known by its owner uuid as well as its sequence number: a parent
//! created again, or a server restored from a backup, numbers new nodes
//! from where it stands, and another owner's node may then bear the same
//! number.
//!
//! **Readers** of a reader-writer lock ([`crate::rw`]) wait in the same
//! view, for the write nodes alone: a read is first (admitted) once no node
//! but reads is ahead of it, and the node watched for it is the nearest
//! such node ahead. A writer waits as a lock's waiter does. The grant of a
//! node ahead creates it again in place, written first: the watcher hears
//! of the write and watches again, as for a node kept by `set_remaining`.
//!
//! An `exists` watch on a queue node never shares a node with the sequence
//! proof's data watch on the parent ([`crate::locks::quiet`]); a persistent watch
//! on the parent would replace that one on servers before 3.9
//! (ZOOKEEPER-4466).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use lockcore::backend::{Clock, Moment};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::connection::session::Session;
use crate::keys::names::{Queue, QueueNode};

mod task;

use task::{Link, run, same_clock};

/// The lines of one session, by parent path.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    lines: Mutex<HashMap<String, Weak<Line>>>,
}

impl Lines {
    /// The view of the queue under `parent`, shared with every other waiter
    /// of `session` (whose lines these are).
    pub(crate) fn line(&self, session: &Arc<Session>, parent: &str) -> Arc<Line> {
        let mut lines = self.lock();
        if let Some(line) = lines.get(parent).and_then(Weak::upgrade) {
            return line;
        }
        if lines.len() >= 64 {
            lines.retain(|_, line| line.strong_count() > 0);
        }
        let line = Line::start(session, parent.to_owned());
        lines.insert(parent.to_owned(), Arc::downgrade(&line));
        line
    }

    /// Node `sequence` under `parent` was deleted by this session.
    pub(crate) fn deleted(&self, parent: &str, sequence: u32) {
        let line = self.lock().get(parent).and_then(Weak::upgrade);
        if let Some(line) = line {
            line.forget(sequence);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Weak<Line>>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a node stands in the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// First in line; `alone` when nobody else is queued. `synced`: the
    /// send time of the `sync` the listing was read behind (the session was
    /// in touch with the leader then, and the node existed after it), if it
    /// was read on this waiter's clock.
    First { alone: bool, synced: Option<Moment> },
    /// Behind another node.
    Behind,
    /// Not in the queue (deleted, or its session ended).
    Missing,
    /// Not listed yet (or the session ended): ask again once woken.
    Unknown,
}

/// The shared view of one queue.
pub(crate) struct Line {
    parent: String,
    state: Mutex<State>,
    /// Wakes the task: a waiter came or went, or this session deleted a node.
    poke: Arc<Notify>,
    task: OnceLock<tokio::task::AbortHandle>,
    /// A joiner is listing the queue with its create ([`Line::probe`]).
    probing: AtomicBool,
}

struct State {
    /// The queue as of the latest listing, less the nodes known gone since.
    nodes: BTreeMap<u32, QueueNode>,
    /// Listings started so far, and the number of the one in `nodes`.
    started: u64,
    listed: u64,
    /// When the `sync` before that listing was sent, and the clock it was
    /// read on (the first local waiter's).
    synced: Option<(Moment, Arc<dyn Clock>)>,
    /// Local waiters by the sequence number of their node.
    waiting: BTreeMap<u32, Waiting>,
    /// The waiter last told it is first.
    told: Option<u32>,
    /// Why the view stopped for good (the session ended).
    ended: Option<String>,
    /// The node watched went while others stayed ahead of it in the view:
    /// those may have gone too, unseen (only the node just ahead is
    /// watched), so the queue is listed again (one round trip) rather than
    /// probed node by node (one round trip each).
    stale: bool,
}

struct Waiting {
    /// The owner uuid of its node: a node of another owner with the same
    /// sequence number (a parent created again, a restored server) is not it.
    guid: Uuid,
    woken: Arc<Notify>,
    /// Listings started before the waiter joined: a later one shows it.
    since: u64,
    /// The clock its lease will be judged on.
    clock: Arc<dyn Clock>,
    /// A reader of a reader-writer lock: only the nodes that are not reads
    /// keep it waiting.
    reads: bool,
}

impl Waiting {
    /// Whether `nodes` show this waiter's node as `sequence`.
    fn shown(&self, nodes: &BTreeMap<u32, QueueNode>, sequence: u32) -> bool {
        nodes.get(&sequence).is_some_and(|n| n.guid == self.guid)
    }

    /// The nearest node ahead of this waiter's node `sequence` that keeps
    /// it waiting, if `nodes` show one: the node just ahead, or for a
    /// reader the nearest node ahead that is no read.
    fn blocker<'n>(
        &self,
        nodes: &'n BTreeMap<u32, QueueNode>,
        sequence: u32,
    ) -> Option<(&'n u32, &'n QueueNode)> {
        let mut ahead = nodes.range(..sequence).rev();
        match self.reads {
            true => ahead.find(|(_, n)| n.blocks_readers()),
            false => ahead.next(),
        }
    }
}

/// A local waiter's place in the view; dropping it withdraws it.
pub(crate) struct Turn {
    line: Arc<Line>,
    sequence: u32,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.line.lock().waiting.remove(&self.sequence);
        self.line.poke.notify_one();
    }
}

/// The right to list the queue with a create; dropping it frees it.
pub(crate) struct Probe(Arc<Line>);

impl Drop for Probe {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// What the task does next.
enum Step {
    /// List the queue (the listing's number), reading the time of its
    /// `sync` on the first local waiter's clock.
    List(u64, Option<Arc<dyn Clock>>),
    /// Watch the node just ahead of the first local waiter, and the
    /// nearest one ahead of that which keeps the waiter waiting (if the
    /// view shows one).
    Watch(u32, String, Option<(u32, String)>),
    /// Nothing to do until poked.
    Rest,
    /// The view ended, or nobody uses it.
    Stop,
}

impl Line {
    fn start(session: &Arc<Session>, parent: String) -> Arc<Line> {
        let line = Arc::new(Line {
            parent: parent.clone(),
            state: Mutex::new(State {
                nodes: BTreeMap::new(),
                started: 0,
                listed: 0,
                synced: None,
                waiting: BTreeMap::new(),
                told: None,
                ended: None,
                stale: false,
            }),
            poke: Arc::new(Notify::new()),
            task: OnceLock::new(),
            probing: AtomicBool::new(false),
        });
        let poke = line.poke.clone();
        let link = Link {
            session: Arc::downgrade(session),
            ended: session.ended.clone(),
            states: session.state_watcher(),
            timeout: session.timeout,
        };
        let task = (session.tasks).spawn(run(Arc::downgrade(&line), poke, link, parent));
        let _ = line.task.set(task.abort_handle());
        line
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the view with node `sequence` of owner `guid`, whose create
    /// was answered: `woken` is told when it may have become first (or the
    /// view ended). `clock`: the one its lease will be judged on. `reads`:
    /// a reader of a reader-writer lock, which waits for no read. `listed`:
    /// the queue as read right behind the create (which shows the node);
    /// when no other local waiter is in the view (whose node it might not
    /// show), it is the view's listing, and the view lists nothing more for
    /// this waiter.
    pub(crate) fn join(
        self: &Arc<Self>,
        (sequence, guid): (u32, Uuid),
        reads: bool,
        woken: Arc<Notify>,
        clock: Arc<dyn Clock>,
        listed: Option<&Queue>,
    ) -> Turn {
        let mut state = self.lock();
        let mut since = state.started;
        if let Some(queue) = listed.filter(|_| state.waiting.is_empty()) {
            // Numbered after every listing started so far: one in flight
            // (read earlier or later, for a waiter since gone) is dropped.
            state.started += 1;
            let number = state.started;
            state.nodes = (queue.nodes().iter())
                .map(|n| (n.sequence, n.clone()))
                .collect();
            (state.listed, state.synced, state.stale) = (number, None, false);
            since = number - 1;
        }
        let waiting = Waiting {
            guid,
            woken,
            since,
            clock,
            reads,
        };
        state.waiting.insert(sequence, waiting);
        drop(state);
        self.poke.notify_one();
        Turn {
            line: self.clone(),
            sequence,
        }
    }

    /// Whether a joiner may list the queue with its create (one round trip
    /// instead of two): only while nobody of this session waits here, and by
    /// one joiner at a time, so a burst of joiners lists the queue once (in
    /// this view), not once each.
    pub(crate) fn probe(self: &Arc<Self>) -> Option<Probe> {
        let idle = self.lock().waiting.is_empty();
        let won = idle && !self.probing.swap(true, Ordering::AcqRel);
        won.then(|| Probe(self.clone()))
    }

    /// Where node `sequence` (a joined waiter's) stands.
    pub(crate) fn place(&self, sequence: u32) -> Place {
        let state = self.lock();
        let Some(waiting) = state.waiting.get(&sequence) else {
            return Place::Unknown;
        };
        if state.ended.is_some() || state.listed <= waiting.since {
            return Place::Unknown;
        }
        if !waiting.shown(&state.nodes, sequence) {
            return Place::Missing;
        }
        match waiting.blocker(&state.nodes, sequence) {
            Some(_) => Place::Behind,
            None => Place::First {
                alone: state.nodes.len() == 1,
                synced: (state.synced.as_ref())
                    .filter(|(_, clock)| same_clock(clock, &waiting.clock))
                    .map(|(at, _)| *at),
            },
        }
    }

    /// The nodes of owner `guid` ahead of node `sequence` (strays of a create
    /// whose reply was lost).
    pub(crate) fn strays_ahead(&self, guid: Uuid, sequence: u32) -> Vec<String> {
        let state = self.lock();
        (state.nodes.range(..sequence))
            .filter(|(_, n)| n.guid == guid)
            .map(|(_, n)| n.name.clone())
            .collect()
    }

    /// Node `sequence` is gone.
    fn forget(&self, sequence: u32) {
        if self.lock().nodes.remove(&sequence).is_some() {
            self.poke.notify_one();
        }
    }

    /// The node watched, `sequence`, is gone (an event, or an `exists` that
    /// found nothing). The view is stale if nodes that keep the first local
    /// waiter waiting are left ahead of it: they were not watched.
    fn passed(&self, sequence: u32) {
        let mut state = self.lock();
        state.nodes.remove(&sequence);
        let State { nodes, waiting, .. } = &*state;
        let first = waiting.iter().find(|(s, w)| w.shown(nodes, **s));
        let stale = first.is_some_and(|(&first, w)| w.blocker(nodes, first).is_some());
        state.stale = stale;
    }

    /// The node watched beyond the one just ahead, `far`, is gone. If the
    /// view still shows nodes ahead of `near` (the one just ahead) that
    /// keep the first local waiter waiting, they may have gone unseen: the
    /// queue is listed again now, while `near` is still there. So when
    /// `near` goes, the view already shows nothing else ahead, and its
    /// delete alone makes the waiter first, with no listing between the
    /// release and the grant.
    fn passed_far(&self, far: u32, near: u32) {
        let mut state = self.lock();
        state.nodes.remove(&far);
        let State { nodes, waiting, .. } = &*state;
        let first = waiting.iter().find(|(s, w)| w.shown(nodes, **s));
        let stale = first.is_some_and(|(_, w)| w.blocker(nodes, near).is_some());
        state.stale |= stale;
    }

    /// What the task does next (telling the first local waiter, if it is).
    fn next_step(&self) -> Step {
        let mut state = self.lock();
        if state.ended.is_some() {
            return Step::Stop;
        }
        let State {
            nodes,
            waiting,
            listed,
            ..
        } = &*state;
        if state.stale || waiting.values().any(|w| w.since >= *listed) {
            // The earliest local waiter is the only one a listing can make first.
            let clock = waiting.values().next().map(|w| w.clock.clone());
            state.stale = false;
            state.started += 1;
            return Step::List(state.started, clock);
        }
        let Some((&first, w)) = waiting.iter().find(|(s, w)| w.shown(nodes, **s)) else {
            return Step::Rest;
        };
        if let Some((&ahead, node)) = w.blocker(nodes, first) {
            let path = |name: &str| format!("{}/{name}", self.parent);
            let far = (w.blocker(nodes, ahead)).map(|(&s, n)| (s, path(&n.name)));
            return Step::Watch(ahead, path(&node.name), far);
        }
        if state.told != Some(first) {
            state.told = Some(first);
            if let Some(w) = state.waiting.get(&first) {
                w.woken.notify_one();
            }
        }
        Step::Rest
    }

    /// Takes listing number `number` (read behind a `sync` sent at `synced`,
    /// read on `clock`).
    fn install(
        &self,
        number: u64,
        children: Vec<String>,
        synced: Option<(Moment, Arc<dyn Clock>)>,
    ) {
        let mut state = self.lock();
        if number <= state.listed {
            return;
        }
        // Most nodes were in the last listing too: reuse them.
        let mut known = std::mem::take(&mut state.nodes);
        state.nodes = (children.into_iter())
            .filter_map(|name| {
                let seen = QueueNode::sequence_of(&name).and_then(|s| known.remove(&s));
                seen.filter(|n| n.name == name)
                    .or_else(|| QueueNode::parse(&name))
            })
            .map(|n| (n.sequence, n))
            .collect();
        (state.listed, state.synced) = (number, synced);
        // Waiters whose node the listing does not show learn it now.
        for (sequence, w) in &state.waiting {
            if w.since < number && !w.shown(&state.nodes, *sequence) {
                w.woken.notify_one();
            }
        }
    }

    /// The session ended: nothing more will come.
    fn end(&self, why: String) {
        let mut state = self.lock();
        state.ended = Some(why);
        for w in state.waiting.values() {
            w.woken.notify_one();
        }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Line")
            .field("parent", &self.parent)
            .field("nodes", &state.nodes.len())
            .field("waiting", &state.waiting.len())
            .finish()
    }
}
