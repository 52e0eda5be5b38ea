//! A granted lock node, as the lease's backend-private extension: its path,
//! its session, its current local deadline, and a watch that turns the node's
//! deletion by anyone else into the lease's loss signal.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use lockcore::backend::CancellationToken;
use lockcore::{Access, FencingToken, HolderLabel, LockName};
use tokio::time::Instant;
use uuid::Uuid;
use zookeeper_client as zk;

use crate::connection::requests;
use crate::connection::session::Session;
use crate::locks::queue::Entry;

/// How a grant ended, as far as this client knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// Still held.
    No,
    /// Released by its owner.
    Released,
    /// Its local deadline passed without a renewal; this client deletes it.
    Expired,
    /// Deleted by someone else (forced release) or its session ended.
    Gone,
    /// Kept by `set_remaining` as a TTL node (see [`crate::locks::remaining`]):
    /// the store frees it at its TTL, whatever becomes of this client's
    /// session; this client no longer watches, expires or deletes it on
    /// its own, but still releases it or sets its remaining time again.
    Kept,
}

struct State {
    deadline: Instant,
    over: Over,
    /// Its owner is deleting it: the deletion is no loss.
    releasing: bool,
    /// Its owner is turning it into a TTL node, which deletes it and creates
    /// it again: the deletion is no loss, and the local deadline does not
    /// delete it meanwhile.
    keeping: bool,
    /// The `czxid` of the TTL node it became (once [`Over::Kept`]).
    kept: Option<i64>,
    /// The keeper's watch on the node, once set.
    watch: Option<Watch>,
}

type Fired = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// A data watch on the node, polled only under the grant's lock (by the
/// keeper's task, and by renewals that look whether it fired).
struct Watch {
    /// When its `exists` was answered (the node existed, the watch was set).
    since: Instant,
    fired: Fired,
    /// What it reported, once it fired (until the keeper's task takes it).
    event: Option<zk::WatchedEvent>,
    /// The keeper task's waker, left registered by every poll.
    task: Option<Waker>,
}

impl Watch {
    /// Polls the watch with the keeper task's waker; whether it fired.
    fn poll_fired(&mut self) -> bool {
        if self.event.is_none() {
            let waker = self.task.clone().unwrap_or_else(|| Waker::noop().clone());
            if let Poll::Ready(event) = self.fired.as_mut().poll(&mut Context::from_waker(&waker)) {
                self.event = Some(event);
                waker.wake_by_ref();
            }
        }
        self.event.is_some()
    }
}

/// One granted lock node.
pub(crate) struct Held {
    pub(crate) session: Arc<Session>,
    pub(crate) name: LockName,
    pub(crate) parent: String,
    pub(crate) path: String,
    /// The node's sequence number, if known.
    pub(crate) sequence: Option<u32>,
    pub(crate) guid: Uuid,
    pub(crate) fence: FencingToken,
    /// How a reader-writer lock's node holds (`None`: a lock or a permit).
    pub(crate) access: Option<Access>,
    /// The holder's label, written again into the node it is kept as.
    pub(crate) label: Option<HolderLabel>,
    /// The node's `czxid`, what renewals compare.
    pub(crate) czxid: i64,
    /// A create of this owner had its reply lost, so a second node with the
    /// same uuid may exist: release sweeps the parent for it.
    pub(crate) strays: bool,
    /// The parent watch this node was created under, and the node's
    /// sequence number, if it was granted alone in the queue: once released,
    /// the session vouches for the next number (see [`crate::locks::quiet`]).
    pub(crate) vouch: Option<(u64, u32)>,
    /// The lease's loss signal: cancelled when the node is deleted by anyone
    /// else, the session ends or its client is closed (it is a child of the
    /// session's `losing`).
    pub(crate) lost: CancellationToken,
    /// Stops the watcher task after a release.
    done: CancellationToken,
    state: Mutex<State>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("path", &self.path)
            .field("fence", &self.fence)
            .field("over", &self.lock().over)
            .finish_non_exhaustive()
    }
}

impl Held {
    /// Records the grant of `entry`'s node as `name` with `fence` and local
    /// deadline `deadline` (hand it to the session's
    /// [`Keeper`](crate::locks::eviction_notice::Keeper), which watches it if it is still
    /// held a while later). `alone`: the queue held only this node, so its
    /// release vouches for the next sequence number (see [`crate::locks::quiet`]).
    pub(crate) fn start(
        entry: Entry,
        name: LockName,
        fence: FencingToken,
        alone: bool,
        deadline: Instant,
    ) -> Option<Arc<Held>> {
        let (session, parent, guid, strays, label, access) = (
            entry.session.clone(),
            entry.parent.clone(),
            entry.guid,
            entry.strays,
            entry.label.clone(),
            entry.access,
        );
        let watched = entry.watched;
        let node = entry.granted()?;
        let czxid = node.czxid;
        let vouch = watched.zip(node.sequence).filter(|_| alone && !strays);
        Some(Arc::new(Held {
            lost: session.losing.child_token(),
            session,
            name,
            parent,
            path: node.path,
            sequence: node.sequence,
            guid,
            fence,
            access,
            label,
            czxid,
            strays,
            vouch,
            done: CancellationToken::new(),
            state: Mutex::new(State {
                deadline,
                over: Over::No,
                releasing: false,
                keeping: false,
                kept: None,
                watch: None,
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How the grant stands.
    pub(crate) fn over(&self) -> Over {
        self.lock().over
    }

    /// The current local deadline.
    pub(crate) fn deadline(&self) -> Instant {
        self.lock().deadline
    }

    /// Completes once the grant was released by its owner (watching stops).
    pub(crate) async fn stopped(&self) {
        self.done.cancelled().await;
    }

    /// Moves the local deadline to `deadline` if the grant is still held and
    /// its current deadline has not passed `now` (a renewal answered too late
    /// never resurrects a lease).
    pub(crate) fn extend(&self, now: Instant, deadline: Instant) -> bool {
        let mut state = self.lock();
        if state.over != Over::No || now >= state.deadline {
            return false;
        }
        state.deadline = state.deadline.max(deadline);
        true
    }

    /// Marks the grant over with `how`; `false` if it already was (by
    /// another path: release vs. expiry vs. deletion).
    pub(crate) fn finish(&self, how: Over) -> bool {
        let mut state = self.lock();
        if state.over != Over::No {
            return false;
        }
        state.over = how;
        true
    }

    /// Marks the grant expired if its deadline has passed `now` (unless it
    /// is being kept: see [`keeping`](Self::keeping)).
    pub(crate) fn expire_if_due(&self, now: Instant) -> bool {
        let mut state = self.lock();
        if state.over == Over::No && !state.keeping && now >= state.deadline {
            state.over = Over::Expired;
            return true;
        }
        false
    }

    /// Marks the node as being deleted by its owner, before the delete is
    /// sent: the server sends the deletion event before the delete's reply,
    /// and that event must not fire the loss signal.
    pub(crate) fn releasing(&self) {
        self.lock().releasing = true;
    }

    /// Marks the node as being turned into a TTL node (`true`, before the
    /// transaction is sent), or no longer (`false`: it is kept, or the
    /// call ended without keeping it): meanwhile its deletion is no loss
    /// and its deadline deletes nothing.
    pub(crate) fn keeping(&self, keeping: bool) {
        self.lock().keeping = keeping;
    }

    /// Whether the node is being turned into a TTL node.
    pub(crate) fn is_keeping(&self) -> bool {
        self.lock().keeping
    }

    /// The node is the TTL node `czxid` now, kept until about `deadline`:
    /// the grant is [`Over::Kept`] and this client stops watching it.
    pub(crate) fn keep(&self, czxid: i64, deadline: Instant) {
        let mut state = self.lock();
        (state.over, state.kept, state.keeping) = (Over::Kept, Some(czxid), false);
        state.deadline = deadline;
        drop(state);
        self.done.cancel();
    }

    /// The `czxid` of the TTL node the grant is kept as, once it is.
    pub(crate) fn kept(&self) -> Option<i64> {
        let state = self.lock();
        state.kept.filter(|_| state.over == Over::Kept)
    }

    /// Marks a kept grant released (by its owner) or gone.
    pub(crate) fn unkeep(&self, how: Over) {
        let mut state = self.lock();
        if state.over == Over::Kept {
            state.over = how;
        }
    }

    /// Deletes this node (and, after a lost create reply, any stray node of
    /// the same owner). `Ok(true)` if this call deleted the node.
    pub(crate) async fn delete(&self) -> Result<bool, zk::Error> {
        let client = self.session.client()?;
        let deleted = requests::delete_node(&client, &self.path).await;
        if self.strays {
            requests::sweep_owner(&client, &self.parent, self.guid).await;
        }
        deleted
    }

    /// Deletes the node of a grant whose deadline passed unrenewed, trying
    /// again while it fails on connection trouble and its session lives
    /// ([`requests::until_cleaned`]): an abandoned lease must not outlive its
    /// deadline just because its session does.
    pub(crate) async fn delete_expired(&self) {
        let what = format!("delete the expired lock node {}", self.path);
        requests::until_cleaned(&self.session, &what, || async {
            self.delete().await.map(drop)
        })
        .await;
    }

    /// Stops watching (after a release).
    pub(crate) fn stop(&self) {
        self.done.cancel();
    }

    /// Takes the keeper's data watch on the node, set by an `exists` that
    /// found it and was answered at `since`.
    pub(crate) fn watching(&self, since: Instant, fired: Fired) {
        self.lock().watch = Some(Watch {
            since,
            fired,
            event: None,
            task: None,
        });
    }

    /// Waits until the watch fires (the keeper's task); the watch is gone
    /// then.
    pub(crate) fn poll_watch(&self, cx: &mut Context<'_>) -> Poll<zk::WatchedEvent> {
        let mut state = self.lock();
        let Some(watch) = state.watch.as_mut() else {
            return Poll::Pending;
        };
        watch.task = Some(cx.waker().clone());
        if !watch.poll_fired() {
            return Poll::Pending;
        }
        let event = watch.event.take();
        state.watch = None;
        event.map_or(Poll::Pending, Poll::Ready)
    }

    /// Whether the node is proven to exist at the point of a request sent
    /// at `sent` and answered since: its watch was set before `sent` and has
    /// not fired by now. ZooKeeper sends the event of a deletion before the
    /// reply to any later request of the session, and the client hands it to
    /// the watch before that reply; so once the reply is in, a deletion
    /// before it shows here. `None`: no such watch, or it fired for another
    /// reason (a write to the node): read the node instead. `Some(false)`:
    /// the node is gone (its task handles the event too).
    pub(crate) fn watched_through(&self, sent: Instant) -> Option<bool> {
        let mut state = self.lock();
        let watch = state.watch.as_mut().filter(|w| w.since <= sent)?;
        if !watch.poll_fired() {
            return Some(true);
        }
        match watch.event.as_ref().map(|e| e.event_type) {
            Some(zk::EventType::NodeDataChanged) => None,
            _ => Some(false),
        }
    }

    /// Whether the keeper's watch was set before `sent`.
    pub(crate) fn watched_before(&self, sent: Instant) -> bool {
        self.lock().watch.as_ref().is_some_and(|w| w.since <= sent)
    }
}

/// The watched node was deleted: released by its owner, or gone (or kept:
/// created again at once, see [`Held::keeping`]).
pub(crate) fn deleted(held: &Held) {
    if held.lock().releasing {
        held.finish(Over::Released);
    } else {
        gone(held);
    }
}

/// The node is gone (forced release, session end) and not by our own hand.
/// Not while it is being kept: that deletes it too, and whoever keeps it
/// learns whether it was there.
pub(crate) fn gone(held: &Held) {
    if held.lock().keeping {
        return;
    }
    if held.finish(Over::Gone) {
        tracing::debug!(name = %held.name, fence = %held.fence, "lock node deleted by someone else or its session ended");
        held.lost.cancel();
    }
}
