//! Messages from the store: one pub/sub connection per backend instance,
//! shared by all its waits and all its leases, whatever their number.
//!
//! **Evictions.** From its first acquire attempt the instance is subscribed
//! to the prefix's eviction channel, `<prefix>evict`. A forced release
//! publishes `<lock key> <owner>:<fence>` there in the same script that
//! deletes the lock; the instance holding that grant cancels the lease's
//! loss signal, so its guard's `lost()` fires about one message after the
//! eviction instead of at its next renewal. Leases are registered *before*
//! their acquire is sent (by owner token, unique per attempt), so an
//! eviction that follows a grant at once is not missed either. Messages
//! published while the instance was not subscribed are lost; so whenever a
//! subscription is (re-)established, every lease it holds is checked against
//! the store (one read-only script each, 64 in flight) and the loss signal
//! of any that no longer holds its lock fires. A subscription that dies
//! without a word (a half-open TCP connection) is found by a `PING` every
//! response timeout while anything is registered, and replaced.
//!
//! **Wake-ups.** Once something waits, the instance also subscribes to one
//! channel of its own. A waiting acquire joins the name's line in Redis with
//! a member naming this channel and a wait id (see `scripts/line.lua`). When
//! the lock is released, or found free by anyone, the script pops the first
//! waiter and publishes to that waiter's instance only: per hand-off one
//! instance and one wait are woken, never a herd. Where the waiter's
//! standing offer allows, the same script grants it the lock, and the
//! message carries the grant (`<member> <lock key> granted <fence> <seq>`):
//! the wait finds it next to its wake-up ([`Wait::take_grant`]) and returns
//! the lease without another request. A message for a wait that has
//! already ended is handed back to the backend ([`Orphan`]), which passes
//! the hand-off on to the next waiter (freeing a grant it carried).
//!
//! **Watches.** `LockBackend::watch` (and `watch_permits`) registers the
//! instance's channel in the key's watcher set; the next release (or forced
//! release) of that key publishes `changed <key>` there once, and the
//! instance wakes every local watch of that key: one message per instance,
//! whatever the number of its watches.
//!
//! When the subscription connection drops, releases meanwhile find no
//! subscriber and skip this instance's waiters; once it is back, every local
//! wait is woken to re-check (and rejoin the line). Until then new waits
//! poll with backoff, and every wait re-checks at least every
//! `WaitPolicy::recheck`: a lost message only ever costs latency.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use lockcore::{Backoff, FencingToken, LockError, OwnerToken};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::target::Target;
use crate::error::{self, BACKEND};

mod holds;
mod link;

pub(crate) use holds::HoldWatch;

/// Pauses between reconnection attempts: jittered, 50 ms doubling to 1 s.
fn reconnect_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
}

/// The subscription connection's state, as waits see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Never connected yet: the first wait waits for it.
    Starting,
    /// Subscribed to the eviction channel, and to the wake-up channel once
    /// `wake` is true.
    Up {
        /// The wake-up channel is subscribed too.
        wake: bool,
    },
    /// Lost; being re-established. Waits poll meanwhile.
    Down,
}

/// What the notifier hands to the backend, whose command connection it
/// needs.
#[derive(Debug)]
pub(crate) enum Event {
    /// A wake-up for a wait that has ended.
    Orphan(Orphan),
    /// Leases to check against the store: evictions may have been
    /// published while they were not heard.
    Check(Checks),
}

/// Held leases to look up, and the subscription they were checked after.
#[derive(Debug)]
pub(crate) struct Checks {
    /// The subscription established before the check; the check is moot
    /// (and stops retrying) once it is gone: the next one checks again.
    pub(crate) subscription: u64,
    /// Each lease: its lock key, the value it holds there, its loss signal.
    pub(crate) leases: Vec<(String, String, CancellationToken)>,
}

/// The leases this instance holds (or is acquiring), by owner token.
#[derive(Default)]
struct Holds {
    leases: HashMap<OwnerToken, Held>,
    /// The current subscription's number, while subscribed. Numbers grow
    /// with every new subscription, so an unchanged number means "subscribed
    /// all along".
    subscription: Option<u64>,
}

struct Held {
    lock_key: String,
    /// Known once the grant's reply is in.
    fence: Option<FencingToken>,
    lost: CancellationToken,
}

/// A wake-up that reached this instance for a wait that has ended: the
/// hand-off it announces must be passed on.
#[derive(Debug)]
pub(crate) struct Orphan {
    /// The ended wait's member in the line.
    pub(crate) member: String,
    /// The lock key the hand-off is for.
    pub(crate) lock_key: String,
    /// The fence of the grant the message carried, if any: to be freed.
    pub(crate) fence: Option<u64>,
}

/// A lock granted to a wait by the script that freed it: its fence, and
/// the number of the wait's attempt whose standing offer it took (the
/// lease counts from that attempt's send).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fence: u64,
    pub(crate) seq: u64,
}

/// One wait's wake-up, and the grant that may have come with it.
#[derive(Default)]
struct Slot {
    notify: Notify,
    grant: Mutex<Option<Grant>>,
}

pub(crate) struct Notifier {
    target: Arc<Target>,
    /// Time to connect and subscribe.
    timeout: Duration,
    /// Time a `PING` on the subscription may take, and the pause between two.
    ping_every: Duration,
    /// This instance's wake-up channel: `<prefix>wake:<random>`.
    channel: String,
    /// The prefix's eviction channel: `<prefix>evict`.
    evictions: String,
    waits: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Local watches by store key; one sender per watched key.
    watches: Mutex<Watches>,
    holds: Mutex<Holds>,
    next_id: AtomicU64,
    link: watch::Sender<Link>,
    /// A wait needs the wake-up channel; `wake_wanted` pokes the connection task.
    wants_wake: AtomicBool,
    wake_wanted: Notify,
    events: mpsc::UnboundedSender<Event>,
    started: OnceLock<()>,
    shutdown: CancellationToken,
    /// The parent of every lease's loss signal: the client's, cancelled
    /// when it closes.
    leases: CancellationToken,
    /// Where the connection task runs: the client's tasks, awaited at close.
    tasks: TaskTracker,
}

/// Local watches: a change channel per watched key, forgotten once nobody
/// listens.
#[derive(Default)]
struct Watches {
    keys: HashMap<String, watch::Sender<()>>,
    /// Sweep keys nobody listens to once the map reaches this size.
    sweep_at: usize,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("link", &*self.link.borrow())
            .field("waits", &self.lock().len())
            .field("watched_keys", &self.watches().keys.len())
            .field("leases", &self.holds().leases.len())
            .finish()
    }
}

/// One registered wait. Dropping it unregisters it; a wake-up that arrives
/// afterwards becomes an [`Orphan`].
pub(crate) struct Wait {
    notifier: Arc<Notifier>,
    id: u64,
    slot: Arc<Slot>,
}

impl Wait {
    /// This wait's member in a line: `<wait id>:<claim window ms>:<channel>`.
    /// A lock handed to it stays reserved for it for `window`. On a Redis
    /// Cluster the window ends in `c`: the instance may listen on another
    /// node than the one that hands the lock over, where `PUBLISH` counts
    /// only its own subscribers, so a count of 0 does not mean it is gone.
    pub(crate) fn member(&self, window: Duration) -> String {
        let ms = window.as_millis().clamp(1, u128::from(u32::MAX));
        let elsewhere = if self.notifier.target.is_cluster() {
            "c"
        } else {
            ""
        };
        format!("{}:{ms}{elsewhere}:{}", self.id, self.notifier.channel)
    }

    /// Completes when this wait is woken; a wake-up that came while nobody
    /// awaited is kept, so none is lost between two attempts.
    pub(crate) fn wakeup(&self) -> lockcore::backend::wait::Wakeup {
        let slot = self.slot.clone();
        Box::pin(async move { slot.notify.notified().await })
    }

    /// The grant a wake-up brought, if one came since the last call.
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        // A single assignment or take under the lock: never half-done.
        self.slot
            .grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        self.notifier.lock().remove(&self.id);
    }
}

impl Notifier {
    /// A notifier with wake-up channel `channel` and eviction channel
    /// `evictions`, and the receiver of what it hands to the backend.
    /// Connecting and subscribing may take `timeout`; a `PING` may take
    /// `ping_every`, and is sent that often while anything is registered.
    /// Every lease's loss signal is a child of `leases`; the connection
    /// task runs on `tasks`.
    pub(crate) fn new(
        target: Arc<Target>,
        (timeout, ping_every): (Duration, Duration),
        channel: String,
        evictions: String,
        leases: CancellationToken,
        tasks: TaskTracker,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Event>) {
        let (events, received) = mpsc::unbounded_channel();
        let notifier = Arc::new(Notifier {
            target,
            timeout,
            ping_every,
            channel,
            evictions,
            waits: Mutex::new(HashMap::new()),
            watches: Mutex::new(Watches::default()),
            holds: Mutex::new(Holds::default()),
            next_id: AtomicU64::new(1),
            link: watch::channel(Link::Starting).0,
            wants_wake: AtomicBool::new(false),
            wake_wanted: Notify::new(),
            events,
            started: OnceLock::new(),
            shutdown: CancellationToken::new(),
            leases,
            tasks,
        });
        (notifier, received)
    }

    /// Stops the connection task (it unsubscribes first, within the
    /// connect timeout); called when the client closes or is dropped.
    pub(crate) fn shutdown(&self) {
        self.shutdown.cancel();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        // Every update under this lock is one map insert or removal that
        // cannot panic half-way, so a poisoned lock holds consistent data.
        self.waits.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn watches(&self) -> MutexGuard<'_, Watches> {
        // As for `lock`.
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn holds(&self) -> MutexGuard<'_, Holds> {
        // As for `lock`: single inserts, removals and field updates.
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the connection task on first use.
    fn start(self: &Arc<Self>) {
        if self.started.set(()).is_ok() {
            self.tasks.spawn(self.clone().run());
        }
    }

    /// This instance's wake-up channel.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Registers a local watch of store key `key`, once the wake-up channel
    /// is subscribed: the receiver sees the next `changed <key>` message (or
    /// a resubscription, after which messages may have been missed).
    ///
    /// # Errors
    /// As [`join`](Self::join).
    pub(crate) async fn watch_key(
        self: &Arc<Self>,
        key: &str,
    ) -> Result<watch::Receiver<()>, LockError> {
        self.subscribed_to_wakeups().await?;
        let mut watches = self.watches();
        if watches.keys.len() >= watches.sweep_at {
            watches.keys.retain(|_, tx| tx.receiver_count() > 0);
            watches.sweep_at = (watches.keys.len() * 2).max(64);
        }
        Ok(watches
            .keys
            .entry(key.to_owned())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe())
    }

    /// Registers a wait once the wake-up channel is subscribed (connecting
    /// on first use), so a wake-up published after this returns is never
    /// missed.
    ///
    /// # Errors
    /// A retryable error while the subscription connection is down.
    pub(crate) async fn join(self: &Arc<Self>) -> Result<Wait, LockError> {
        self.subscribed_to_wakeups().await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot::default());
        self.lock().insert(id, slot.clone());
        Ok(Wait {
            notifier: self.clone(),
            id,
            slot,
        })
    }

    /// Waits until the wake-up channel is subscribed, connecting on first use.
    async fn subscribed_to_wakeups(self: &Arc<Self>) -> Result<(), LockError> {
        if !self.wants_wake.swap(true, Ordering::SeqCst) {
            self.wake_wanted.notify_one();
        }
        self.start();
        let mut link = self.link.subscribe();
        let ready = tokio::time::timeout(
            self.timeout,
            link.wait_for(|l| matches!(l, Link::Up { wake: true } | Link::Down)),
        )
        .await;
        match ready {
            Ok(Ok(link)) if *link == (Link::Up { wake: true }) => {}
            Ok(_) => return Err(link_down()),
            Err(_) => return Err(error::timed_out("pub/sub connect", self.timeout)),
        }
        Ok(())
    }

    /// Handles one message on the wake-up channel: `changed <key>` wakes the
    /// local watches of that key; `<member> <lock key>[ granted <fence>
    /// <seq>]` wakes the wait it names (leaving it the grant), or hands it
    /// back if that wait has ended.
    fn dispatch(&self, payload: &str) {
        if let Some(key) = payload.strip_prefix("changed ") {
            let mut watches = self.watches();
            if let Some(tx) = watches.keys.get(key) {
                if tx.receiver_count() > 0 {
                    tx.send_replace(());
                } else {
                    watches.keys.remove(key);
                }
            }
            return;
        }
        let Some((member, rest)) = payload.split_once(' ') else {
            return;
        };
        let (lock_key, grant) = split_grant(rest);
        let id = member.split_once(':').and_then(|(id, rest)| {
            let (_window, channel) = rest.split_once(':')?;
            (channel == self.channel).then(|| id.parse::<u64>().ok())?
        });
        let Some(id) = id else {
            tracing::debug!(payload, "ignoring a wake-up this instance did not ask for");
            return;
        };
        let slot = self.lock().get(&id).cloned();
        match slot {
            Some(slot) => {
                if grant.is_some() {
                    *slot.grant.lock().unwrap_or_else(|p| p.into_inner()) = grant;
                }
                slot.notify.notify_one();
            }
            None => {
                // The wait may have ended by taking this very grant (its
                // next attempt found the lock its owner's): never free that.
                let fence = grant
                    .map(|g| g.fence)
                    .filter(|&fence| !self.holds_grant(lock_key, fence));
                let _ = self.events.send(Event::Orphan(Orphan {
                    member: member.to_owned(),
                    lock_key: lock_key.to_owned(),
                    fence,
                }));
            }
        }
    }

    /// Wakes every wait and watch: after a reconnect, wake-ups may have
    /// been missed.
    fn wake_all(&self) {
        for slot in self.lock().values() {
            slot.notify.notify_one();
        }
        for tx in self.watches().keys.values() {
            tx.send_replace(());
        }
    }

    /// Whether anything listens: then the subscription is watched with `PING`.
    fn in_use(&self) -> bool {
        !self.holds().leases.is_empty()
            || !self.lock().is_empty()
            || self
                .watches()
                .keys
                .values()
                .any(|tx| tx.receiver_count() > 0)
    }
}

/// Splits `<lock key>[ granted <fence> <seq>]`. A lock key ends in `}`,
/// so it never ends like a grant.
fn split_grant(rest: &str) -> (&str, Option<Grant>) {
    let mut parts = rest.rsplitn(4, ' ');
    let (Some(seq), Some(fence), Some("granted"), Some(lock_key)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return (rest, None);
    };
    match (fence.parse(), seq.parse()) {
        (Ok(fence), Ok(seq)) => (lock_key, Some(Grant { fence, seq })),
        _ => (rest, None),
    }
}

fn link_down() -> LockError {
    LockError::unavailable(
        BACKEND,
        "the pub/sub connection is down; waiting falls back to polling",
    )
}
