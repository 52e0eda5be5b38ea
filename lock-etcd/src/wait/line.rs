//! One shared view of a lock's queue per client: which entries exist, in
//! create revision order, kept current by the queue's deletes on the shared
//! watch, and which of them are this client's waiters.
//!
//! However many of its tasks wait on one name, a client follows the queue
//! once: one watch, one task applying deletes, and reads only to learn of
//! entries created since the view was last complete (one at a time, each
//! covering every enqueue answered before it). Each delete wakes at most the
//! waiter whose turn it makes it, and the waiter whose entry it removed.
//!
//! The view is exact, not optimistic: entries only ever get newer
//! revisions, so a waiter's line ahead can only shrink, and the watch
//! delivers every delete in revision order. A waiter can judge its turn once
//! the view knows every entry created up to its own; until then it asks for
//! a read. A delete is applied only to an older incarnation of its key, and
//! a read's entry only if no later delete of it was seen, so views built
//! from reads and events racing each other stay exact.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use lockcore::{Backoff, LockError};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::connection::Conn;
use crate::error::timed;
use crate::fence::floor::Floor;
use crate::keys::{Keys, range_end};
use crate::wait::hub::{Change, Events, Hub};

/// How long a line outlives its last waiter (the watch lingers too).
const LINGER: Duration = Duration::from_secs(5);

/// Where a waiter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Its entry is the oldest: the lock is its.
    Mine,
    /// Older entries exist.
    Waiting,
    /// Its entry is gone (expired, evicted, cleared).
    Gone,
    /// The view does not know every older entry yet (a read is coming).
    Unknown,
}

/// How an enqueue reads the queue along with its put.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read {
    /// The whole queue: nobody follows it yet, and if this entry is the
    /// oldest it holds the lock without any watch.
    All,
    /// Entries created from this revision on (view generation `1`).
    Since(i64, u64),
    /// Nothing: another read is on its way.
    Nothing,
}

/// The lines of one client.
pub(crate) struct Lines {
    hub: Arc<Hub>,
    conn: Arc<Conn>,
    timeout: Duration,
    floor: Arc<Floor>,
    lines: Mutex<HashMap<Vec<u8>, Arc<Line>>>,
}

/// The view of one queue.
pub(crate) struct Line {
    queue: Vec<u8>,
    state: Mutex<State>,
    /// Wakes the line's task: a read is wanted.
    work: Notify,
}

#[derive(Default)]
struct State {
    /// Entries known to exist, by create revision.
    entries: BTreeMap<i64, Vec<u8>>,
    revisions: HashMap<Vec<u8>, i64>,
    /// Every entry created up to this revision is known.
    complete_to: i64,
    /// Deletes are followed (the view was read after subscribing).
    live: bool,
    /// Bumped whenever the view is rebuilt from a full read.
    generation: u64,
    /// Reads in flight outside the task: deletes of keys the view does not
    /// know are kept for them.
    pending: usize,
    late_deletes: HashMap<Vec<u8>, i64>,
    /// An enqueue reads along with its put (the next ones do without).
    reading: bool,
    /// A waiter needs every entry up to here.
    wanted: i64,
    /// A full read is wanted (to verify the view).
    verify: bool,
    last_full_read: Option<Instant>,
    /// This client's waiters: entry key → wake-up counter.
    waiters: HashMap<Vec<u8>, watch::Sender<u64>>,
    idle_since: Option<Instant>,
    task: bool,
}

impl Lines {
    pub(crate) fn new(
        hub: Arc<Hub>,
        conn: Arc<Conn>,
        timeout: Duration,
        floor: Arc<Floor>,
    ) -> Self {
        Lines {
            hub,
            conn,
            timeout,
            floor,
            lines: Mutex::default(),
        }
    }

    /// The view of `queue` (created if needed).
    pub(crate) fn get(&self, queue: &[u8]) -> Arc<Line> {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .entry(queue.to_vec())
            .or_insert_with(|| {
                Arc::new(Line {
                    queue: queue.to_vec(),
                    state: Mutex::default(),
                    work: Notify::new(),
                })
            })
            .clone()
    }

    /// Drops `line` from the registry if nothing uses it (a waiter that got
    /// the lock at once, or gave up, without following the queue).
    pub(crate) fn drop_unused(&self, line: &Arc<Line>) {
        let mut all = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let state = line.lock();
        if !state.task
            && state.waiters.is_empty()
            && state.pending == 0
            && all.get(&line.queue).is_some_and(|l| Arc::ptr_eq(l, line))
        {
            all.remove(&line.queue);
        }
    }

    /// Registers a waiter (its entry `key`, created at `revision`) that
    /// `wake` tells of changes, and starts following the queue if needed.
    pub(crate) fn register(
        self: &Arc<Self>,
        line: &Arc<Line>,
        key: &[u8],
        revision: i64,
        wake: watch::Sender<u64>,
    ) {
        let mut state = line.lock();
        state.waiters.insert(key.to_vec(), wake);
        state.idle_since = None;
        state.wanted = state.wanted.max(revision);
        if !state.task {
            state.task = self
                .conn
                .spawn_task(follow(Arc::downgrade(self), line.clone()));
        }
        drop(state);
        line.work.notify_one();
    }

    /// One read of the queue: entries created from `min_create` on (all
    /// with 0, and the fence floor with them), and the revision read at.
    async fn read(&self, queue: &[u8], min_create: i64) -> Result<(Vec<KeyValue>, i64), LockError> {
        let mut options = GetOptions::new()
            .with_range(range_end(queue))
            .with_keys_only();
        if min_create > 0 {
            options = options.with_min_create_revision(min_create);
        }
        let mut reads = vec![TxnOp::get(queue.to_vec(), Some(options))];
        if min_create == 0 {
            // A view built from scratch may have missed a raise's marker.
            reads.push(self.floor.get());
        }
        let reply = timed(
            self.timeout,
            "queue read",
            self.conn.kv()?.txn(Txn::new().and_then(reads)),
        )
        .await?;
        let at = reply.header().map_or(0, |h| h.revision());
        let mut ranges = reply.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        });
        let kvs = ranges.next().unwrap_or_default();
        if let Some(floor) = ranges.next() {
            self.floor.learn(&floor)?;
        }
        Ok((kvs, at))
    }
}

impl Line {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What an enqueue should read along with its put; pair with
    /// [`enqueued`](Self::enqueued).
    pub(crate) fn begin_enqueue(&self) -> Read {
        let mut state = self.lock();
        state.pending += 1;
        if !state.live {
            // Alone and unfollowed: read it all, maybe the lock is ours at
            // once. Otherwise the follower's read will do.
            if state.pending == 1 && !state.task {
                Read::All
            } else {
                Read::Nothing
            }
        } else if !state.reading {
            state.reading = true;
            Read::Since(state.complete_to + 1, state.generation)
        } else {
            Read::Nothing
        }
    }

    /// An enqueue finished: its entry `key` created at `revision` (if the
    /// put was answered), and what it read at that revision.
    pub(crate) fn enqueued(&self, read: Read, mine: Option<(&[u8], i64)>, kvs: &[KeyValue]) {
        let mut state = self.lock();
        state.pending = state.pending.saturating_sub(1);
        if let Read::Since(from, generation) = read {
            state.reading = false;
            if let Some((_, at)) = mine
                && generation == state.generation
                && state.live
            {
                state.merge(kvs, from, at);
            }
        }
        // Until a read covers it, the view learns of our entry from the put.
        if let Some((key, revision)) = mine
            && state.complete_to < revision
        {
            state.insert(key, revision);
        }
        if state.pending == 0 {
            state.late_deletes.clear();
        }
        state.wake_turns();
    }

    /// Where the waiter with entry `key`, created at `revision`, stands.
    pub(crate) fn turn(&self, key: &[u8], revision: i64) -> Turn {
        let state = self.lock();
        if !state.live || state.complete_to < revision {
            Turn::Unknown
        } else if state.revisions.get(key) != Some(&revision) {
            Turn::Gone
        } else if state.entries.first_key_value().map(|(r, _)| *r) == Some(revision) {
            Turn::Mine
        } else {
            Turn::Waiting
        }
    }

    /// Asks for a read up to `revision` (or a full one to verify the view
    /// if the last is older than `verify_after`).
    pub(crate) fn want(&self, revision: i64, verify_after: Duration) {
        let mut state = self.lock();
        state.wanted = state.wanted.max(revision);
        if state
            .last_full_read
            .is_some_and(|at| at.elapsed() >= verify_after)
        {
            state.verify = true;
        }
        drop(state);
        self.work.notify_one();
    }

    /// The waiter with entry `key` left (granted, gone or cancelled).
    pub(crate) fn unregister(&self, key: &[u8]) {
        let mut state = self.lock();
        state.waiters.remove(key);
        if state.waiters.is_empty() {
            state.idle_since = Some(Instant::now());
        }
    }
}

impl State {
    fn head(&self) -> Option<i64> {
        self.entries.first_key_value().map(|(r, _)| *r)
    }

    fn insert(&mut self, key: &[u8], revision: i64) {
        if self.late_deletes.get(key).is_some_and(|d| *d > revision) {
            return; // deleted after this read saw it
        }
        match self.revisions.get(key) {
            Some(known) if *known >= revision => return,
            Some(older) => {
                let older = *older;
                self.entries.remove(&older);
            }
            None => {}
        }
        self.revisions.insert(key.to_vec(), revision);
        self.entries.insert(revision, key.to_vec());
    }

    /// Entries a read saw at revision `at`, of those created from `from`
    /// on: known entries of that span it did not see are gone, and every
    /// creation up to `at` is known from now on.
    fn merge(&mut self, kvs: &[KeyValue], from: i64, at: i64) {
        let seen: std::collections::HashSet<&[u8]> = kvs.iter().map(KeyValue::key).collect();
        let gone: Vec<(i64, Vec<u8>)> = self
            .entries
            .range(from..=at)
            .filter(|(_, key)| !seen.contains(key.as_slice()))
            .map(|(r, k)| (*r, k.clone()))
            .collect();
        for (revision, key) in gone {
            self.entries.remove(&revision);
            self.revisions.remove(&key);
            wake(&self.waiters, &key);
        }
        for kv in kvs {
            self.insert(kv.key(), kv.create_revision());
        }
        self.complete_to = self.complete_to.max(at);
    }

    /// A full read at `at`, made after subscribing: the view from scratch.
    fn reset(&mut self, kvs: &[KeyValue], at: i64) {
        self.entries.clear();
        self.revisions.clear();
        self.complete_to = 0;
        self.generation += 1;
        self.live = true;
        self.merge(kvs, 0, at);
        self.last_full_read = Some(Instant::now());
        self.wake_all();
    }

    fn delete(&mut self, change: &Change) {
        let head = self.head();
        match self.revisions.get(&change.key) {
            Some(created) if *created < change.revision => {
                let created = *created;
                self.revisions.remove(&change.key);
                self.entries.remove(&created);
                wake(&self.waiters, &change.key);
            }
            Some(_) => {}
            None if self.pending > 0 => {
                let seen = self.late_deletes.entry(change.key.clone()).or_default();
                *seen = (*seen).max(change.revision);
            }
            None => {}
        }
        if self.head() != head {
            self.wake_turns();
        }
    }

    /// Wakes the waiter at the head (its turn may have come).
    fn wake_turns(&self) {
        if let Some((_, key)) = self.entries.first_key_value() {
            wake(&self.waiters, key);
        }
        // Waiters whose entries the view does not know yet wait for the read.
        for (key, tx) in &self.waiters {
            if !self.revisions.contains_key(key) {
                tx.send_modify(|n| *n += 1);
            }
        }
    }

    fn wake_all(&self) {
        for tx in self.waiters.values() {
            tx.send_modify(|n| *n += 1);
        }
    }
}

fn wake(waiters: &HashMap<Vec<u8>, watch::Sender<u64>>, key: &[u8]) {
    if let Some(tx) = waiters.get(key) {
        tx.send_modify(|n| *n += 1);
    }
}

/// Follows one queue while it has waiters (and [`LINGER`] after): builds the
/// view after subscribing, applies deletes, reads on demand; after a stream
/// failure, subscribes and builds it again.
async fn follow(lines: Weak<Lines>, line: Arc<Line>) {
    let backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    let mut failures = 0;
    loop {
        let Some(owner) = lines.upgrade() else {
            return;
        };
        let outcome = serve(&owner, &line).await;
        match outcome {
            Ok(()) => {
                // Idle: leave, unless a waiter came meanwhile.
                let mut all = owner.lines.lock().unwrap_or_else(|p| p.into_inner());
                let mut state = line.lock();
                if state.waiters.is_empty() {
                    state.task = false;
                    state.live = false;
                    if all.get(&line.queue).is_some_and(|l| Arc::ptr_eq(l, &line)) {
                        all.remove(&line.queue);
                    }
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "following an etcd queue failed; starting over");
                {
                    let mut all = owner.lines.lock().unwrap_or_else(|p| p.into_inner());
                    let mut state = line.lock();
                    state.live = false;
                    if state.waiters.is_empty() {
                        // Nobody left to follow it for.
                        state.task = false;
                        if all.get(&line.queue).is_some_and(|l| Arc::ptr_eq(l, &line)) {
                            all.remove(&line.queue);
                        }
                        return;
                    }
                    state.wake_all();
                }
                drop(owner);
                tokio::time::sleep(backoff.delay(failures)).await;
                failures += 1;
            }
        }
    }
}

async fn serve(lines: &Lines, line: &Line) -> Result<(), LockError> {
    let mut changes = lines.hub.subscribe(&line.queue, Events::Deletes).await?;
    let (kvs, at) = lines.read(&line.queue, 0).await?;
    line.lock().reset(&kvs, at);
    let mut idle_check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(change) => match Keys::floor_raised(&line.queue, &change.key) {
                    // A raise of the fence floor: waiters look at their offset.
                    Some(offset) => {
                        lines.floor.raised(offset);
                        line.lock().wake_all();
                    }
                    None => line.lock().delete(&change),
                },
                None => return Err(LockError::unavailable(crate::error::BACKEND, "the watch ended")),
            },
            () = line.work.notified() => {
                let (full, from, wanted) = {
                    let mut state = line.lock();
                    let full = std::mem::take(&mut state.verify);
                    (full, state.complete_to + 1, state.wanted)
                };
                if full {
                    let (kvs, at) = lines.read(&line.queue, 0).await?;
                    line.lock().reset(&kvs, at);
                } else if wanted >= from {
                    let (kvs, at) = lines.read(&line.queue, from).await?;
                    let mut state = line.lock();
                    state.merge(&kvs, from, at);
                    state.wake_turns();
                    if state.wanted > state.complete_to {
                        line.work.notify_one();
                    }
                }
            }
            _ = idle_check.tick() => {
                let state = line.lock();
                if state.idle_since.is_some_and(|since| since.elapsed() >= LINGER) {
                    return Ok(());
                }
            }
        }
    }
}
