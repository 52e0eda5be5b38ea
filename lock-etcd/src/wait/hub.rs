//! One etcd watch stream per backend instance, shared by everything that
//! needs etcd's notifications: each name's line of waiters, the waiters of
//! reader-writer locks, eviction notices, and
//! [`LockBackend::watch`](lockcore::LockBackend::watch) of every kind.
//!
//! On that stream, each key prefix this instance cares about (a lock's
//! queue, a semaphore's slots, a reader-writer lock's keys, a session's
//! notices) has one watch, on
//! deletes only or puts only. Every subscriber to a prefix gets every such
//! change under it, in revision order.
//!
//! Watches are created rarely and kept: a name's watch outlives its last
//! subscriber by [`LINGER`]. That is what keeps hand-offs on etcd's fast
//! path. etcd registers a watch created "from now" as *unsynced* whenever a
//! write lands while it is being set up (it reads the revision before it
//! takes the store lock), and unsynced watches are served by a loop that runs
//! every 100 ms. On a busy lock a write is nearly always in flight, so a
//! watch created per wait delivered about one hand-off in fifty 10 to 100 ms
//! late. A watch that lives on is synced once and stays synced.
//!
//! If the stream fails, every subscription ends (its [`Subscription::next`]
//! returns `None`): events may have been missed, and the subscriber reads
//! where it stands again after subscribing anew. The next subscription opens
//! a new stream.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchResponse};
use lockcore::LockError;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::connection::Conn;
use crate::error::{self, BACKEND, timed};
use crate::keys::range_end;

/// How long a name's watch outlives its last subscriber.
pub(crate) const LINGER: Duration = Duration::from_secs(5);
/// Idle watches kept at most (beyond this, the oldest are cancelled).
const MAX_IDLE: usize = 64;
/// How often idle watches are looked at.
const SWEEP: Duration = Duration::from_secs(1);

/// Which changes a prefix's watch reports (each prefix is only ever
/// watched one way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Events {
    Deletes,
    All,
}

/// A key deleted or put under a watched prefix, at `revision` (a put's
/// value with it).
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) key: Vec<u8>,
    pub(crate) revision: i64,
    pub(crate) deleted: bool,
    pub(crate) value: Vec<u8>,
}

#[derive(Debug)]
enum Note {
    /// etcd confirmed the watch.
    Ready,
    Changed(Change),
    /// etcd refused the watch (e.g. no permission).
    Refused(String),
}

/// Why a subscription failed.
enum Failed {
    /// etcd refused to create the watch.
    Refused(LockError),
    Other(LockError),
}

impl Failed {
    fn into_error(self) -> LockError {
        match self {
            Failed::Refused(e) | Failed::Other(e) => e,
        }
    }
}

/// The shared stream of one backend instance.
pub(crate) struct Hub {
    conn: Arc<Conn>,
    timeout: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The stream task's inbox (prefixes to watch), while it runs.
    task: Option<mpsc::UnboundedSender<(Vec<u8>, Events)>>,
    /// Which stream task is current; an older one only exits.
    generation: u64,
    /// Watched queues.
    names: HashMap<Vec<u8>, Name>,
    /// etcd's watch id → queue, for confirmed watches.
    ids: HashMap<i64, Vec<u8>>,
    /// Creates sent and not yet confirmed, in order (etcd confirms in order).
    creating: VecDeque<Vec<u8>>,
    next_subscriber: u64,
}

#[derive(Debug, Default)]
struct Name {
    /// etcd's watch id, once confirmed.
    id: Option<i64>,
    subscribers: HashMap<u64, mpsc::UnboundedSender<Note>>,
    /// Since when nobody subscribes (a confirmed watch without subscribers).
    idle_since: Option<Instant>,
}

/// Deletes under one queue, from the moment of subscribing.
#[derive(Debug)]
pub(crate) struct Subscription {
    hub: Weak<Hub>,
    queue: Vec<u8>,
    id: u64,
    notes: mpsc::UnboundedReceiver<Note>,
}

impl Subscription {
    /// The next change under the prefix. `None`: the watch is gone (stream
    /// failure, etcd cancelled it, backend dropped); changes may have been
    /// missed, so subscribe again and look where things stand.
    pub(crate) async fn next(&mut self) -> Option<Change> {
        loop {
            match self.notes.recv().await? {
                Note::Changed(change) => return Some(change),
                Note::Ready => {}
                Note::Refused(_) => return None,
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let mut state = hub.lock();
        if let Some(name) = state.names.get_mut(&self.queue)
            && name.subscribers.remove(&self.id).is_some()
            && name.subscribers.is_empty()
            && name.id.is_some()
        {
            name.idle_since = Some(Instant::now());
        }
    }
}

impl Hub {
    pub(crate) fn new(conn: Arc<Conn>, timeout: Duration) -> Self {
        Hub {
            conn,
            timeout,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A subscription to the `events` under `queue` (a prefix ending in
    /// `/`), creating its watch if needed; returns once etcd confirmed the
    /// watch, so every change committed after this returns reaches it.
    ///
    /// # Errors
    /// Retryable when the stream fails or etcd does not answer in time;
    /// [`LockError::Store`] when etcd refuses the watch.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        queue: &[u8],
        events: Events,
    ) -> Result<Subscription, LockError> {
        match self.try_subscribe(queue, events).await {
            // With auth, a stream keeps the token it was opened with, and etcd
            // refuses new watches on it once that token expired: one more
            // try on a new stream before calling it a refusal.
            Err(Failed::Refused(_)) => {
                self.restart();
                self.try_subscribe(queue, events)
                    .await
                    .map_err(Failed::into_error)
            }
            other => other.map_err(Failed::into_error),
        }
    }

    async fn try_subscribe(
        self: &Arc<Self>,
        queue: &[u8],
        events: Events,
    ) -> Result<Subscription, Failed> {
        let mut subscription = {
            let mut state = self.lock();
            let confirmed = match state.names.get(queue) {
                Some(name) => name.id.is_some(),
                None => {
                    self.create(&mut state, queue, events);
                    false
                }
            };
            let subscription = self.register(&mut state, queue);
            if confirmed {
                return Ok(subscription);
            }
            subscription
        };
        let failed = |e| Err(Failed::Other(e));
        match tokio::time::timeout(self.timeout, subscription.notes.recv()).await {
            Ok(Some(Note::Ready)) => Ok(subscription),
            Ok(Some(Note::Refused(reason))) => Err(Failed::Refused(LockError::store(
                BACKEND,
                format!("etcd refused to watch the lock's keys: {reason}"),
            ))),
            // etcd holds events back until it confirmed the watch.
            Ok(Some(Note::Changed(_))) => {
                failed(error::protocol("a watch event before its creation"))
            }
            Ok(None) => failed(LockError::unavailable(BACKEND, "the watch stream failed")),
            Err(_) => {
                // The stream may be stuck: start over with a new one.
                self.restart();
                failed(LockError::unavailable(
                    BACKEND,
                    format!("watch got no answer within {:?}", self.timeout),
                ))
            }
        }
    }

    fn register(self: &Arc<Self>, state: &mut State, queue: &[u8]) -> Subscription {
        let (tx, notes) = mpsc::unbounded_channel();
        let id = state.next_subscriber;
        state.next_subscriber += 1;
        if let Some(name) = state.names.get_mut(queue) {
            name.subscribers.insert(id, tx);
            name.idle_since = None;
        }
        Subscription {
            hub: Arc::downgrade(self),
            queue: queue.to_vec(),
            id,
            notes,
        }
    }

    /// Asks the stream task (started if needed) to create the watch of `queue`.
    fn create(self: &Arc<Self>, state: &mut State, queue: &[u8], events: Events) {
        state.names.insert(queue.to_vec(), Name::default());
        state.creating.push_back(queue.to_vec());
        if state.task.is_none() {
            // Without a runtime, or once closed, there is no stream: the
            // send below fails and the subscriber gets an error, never a panic.
            if let Ok(client) = self.conn.get() {
                let (tx, inbox) = mpsc::unbounded_channel();
                let task = run(
                    Arc::downgrade(self),
                    client,
                    self.timeout,
                    inbox,
                    state.generation + 1,
                );
                if self.conn.spawn_task(task) {
                    state.generation += 1;
                    state.task = Some(tx);
                }
            }
        }
        let sent = state
            .task
            .as_ref()
            .is_some_and(|task| task.send((queue.to_vec(), events)).is_ok());
        if !sent {
            // The task is gone: fail everything, the subscribers start over.
            Self::clear(state);
        }
    }

    /// Ends the stream at close: every subscription ends (the conn lets no
    /// new stream start).
    pub(crate) fn close(&self) {
        Self::clear(&mut self.lock());
    }

    /// Ends the current stream: every subscription ends, the next one opens a
    /// new stream.
    fn restart(&self) {
        Self::clear(&mut self.lock());
    }

    fn clear(state: &mut State) {
        state.task = None; // its inbox closes: the task exits
        state.generation += 1;
        state.names.clear(); // drops every subscriber's sender
        state.ids.clear();
        state.creating.clear();
    }

    /// Ends the stream of `generation` if it is still the current one.
    fn failed(&self, generation: u64) {
        let mut state = self.lock();
        if state.generation == generation {
            Self::clear(&mut state);
        }
    }

    /// Hands one reply of the stream of `generation` to the subscribers.
    /// `false`: this stream is no longer current, or etcd broke protocol.
    fn dispatch(&self, generation: u64, reply: &WatchResponse) -> bool {
        let mut state = self.lock();
        if state.generation != generation {
            return false;
        }
        if reply.created() {
            let Some(queue) = state.creating.pop_front() else {
                return false;
            };
            let Some(name) = state.names.get_mut(&queue) else {
                return false;
            };
            if reply.canceled() {
                for subscriber in name.subscribers.values() {
                    let _ = subscriber.send(Note::Refused(reply.cancel_reason().to_owned()));
                }
                state.names.remove(&queue);
                return true;
            }
            name.id = Some(reply.watch_id());
            for subscriber in name.subscribers.values() {
                let _ = subscriber.send(Note::Ready);
            }
            if name.subscribers.is_empty() {
                name.idle_since = Some(Instant::now());
            }
            state.ids.insert(reply.watch_id(), queue);
            return true;
        }
        // Replies for a watch cancelled by the sweep may still trail in.
        let Some(queue) = state.ids.get(&reply.watch_id()).cloned() else {
            return true;
        };
        if reply.canceled() || reply.compact_revision() != 0 {
            // etcd ended this watch: its subscribers start over.
            state.ids.remove(&reply.watch_id());
            state.names.remove(&queue);
            return true;
        }
        let Some(name) = state.names.get(&queue) else {
            return true;
        };
        for event in reply.events() {
            let Some(kv) = event.kv() else {
                continue;
            };
            let change = Change {
                key: kv.key().to_vec(),
                revision: kv.mod_revision(),
                deleted: event.event_type() == EventType::Delete,
                value: kv.value().to_vec(),
            };
            for subscriber in name.subscribers.values() {
                let _ = subscriber.send(Note::Changed(change.clone()));
            }
        }
        true
    }

    /// Drops watches idle for [`LINGER`] (and the oldest idle ones beyond
    /// [`MAX_IDLE`]); returns their ids to cancel, or `None` when nothing is
    /// watched any more and the stream of `generation` should close.
    fn sweep(&self, generation: u64) -> Option<Vec<i64>> {
        let mut state = self.lock();
        if state.generation != generation {
            return None;
        }
        let now = Instant::now();
        let mut idle: Vec<(Instant, Vec<u8>)> = state
            .names
            .iter()
            .filter_map(|(queue, name)| name.idle_since.map(|since| (since, queue.clone())))
            .collect();
        idle.sort();
        let excess = idle.len().saturating_sub(MAX_IDLE);
        let mut cancel = Vec::new();
        for (i, (since, queue)) in idle.into_iter().enumerate() {
            if (i < excess || since + LINGER <= now)
                && let Some(id) = state.names.remove(&queue).and_then(|name| name.id)
            {
                state.ids.remove(&id);
                cancel.push(id);
            }
        }
        if state.names.is_empty() {
            state.task = None;
            return None;
        }
        Some(cancel)
    }

    /// Names watched right now (confirmed or being created).
    pub(crate) fn watched(&self) -> usize {
        self.lock().names.len()
    }
}

fn options(prefix: &[u8], events: Events) -> WatchOptions {
    let options = WatchOptions::new().with_range(range_end(prefix));
    match events {
        Events::Deletes => options.with_filters([WatchFilterType::NoPut]),
        Events::All => options,
    }
}

/// The stream task: sends creates and cancels, dispatches replies, sweeps
/// idle watches; on any failure, ends every subscription.
async fn run(
    hub: Weak<Hub>,
    client: Client,
    timeout: Duration,
    mut inbox: mpsc::UnboundedReceiver<(Vec<u8>, Events)>,
    generation: u64,
) {
    if let Err(e) = serve(&hub, client, timeout, &mut inbox, generation).await {
        tracing::debug!(error = %e, "etcd watch stream failed; subscribers start over");
    }
    if let Some(hub) = hub.upgrade() {
        hub.failed(generation);
    }
}

async fn serve(
    hub: &Weak<Hub>,
    mut client: Client,
    timeout: Duration,
    inbox: &mut mpsc::UnboundedReceiver<(Vec<u8>, Events)>,
    generation: u64,
) -> Result<(), LockError> {
    // The stream opens with its first watch.
    let Some((first, events)) = inbox.recv().await else {
        return Ok(());
    };
    let stream = timed(
        timeout,
        "watch",
        client.watch(first.clone(), Some(options(&first, events))),
    )
    .await?;
    let (mut requests, mut replies) = stream.split();
    let mut sweep = tokio::time::interval_at(Instant::now() + SWEEP, SWEEP);
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            request = inbox.recv() => match request {
                Some((prefix, events)) => requests
                    .watch(prefix.clone(), Some(options(&prefix, events)))
                    .await
                    .map_err(error::map)?,
                None => return Ok(()), // replaced or backend dropped
            },
            reply = replies.message() => match reply.map_err(error::map)? {
                Some(reply) => {
                    let current = hub.upgrade().is_some_and(|hub| hub.dispatch(generation, &reply));
                    if !current {
                        return Ok(());
                    }
                }
                None => return Err(LockError::unavailable(BACKEND, "etcd closed the watch stream")),
            },
            _ = sweep.tick() => {
                let Some(cancel) = hub.upgrade().and_then(|hub| hub.sweep(generation)) else {
                    return Ok(()); // nothing left to watch: close the stream
                };
                for id in cancel {
                    requests.cancel(id).await.map_err(error::map)?;
                }
            }
        }
    }
}
