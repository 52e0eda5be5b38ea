//! A granted lock node, as the lease's backend-private extension: its path,
//! its session, its current local deadline, and a watch that turns the node's
//! deletion by anyone else into the lease's loss signal.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lockcore::backend::CancellationToken;
use lockcore::{FencingToken, LockName};
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;
use zookeeper_client as zk;

use crate::queue;
use crate::session::Session;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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
}

struct State {
    deadline: Instant,
    over: Over,
    /// Its owner is deleting it: the deletion is no loss.
    releasing: bool,
}

/// One granted lock node.
pub(crate) struct Held {
    pub(crate) session: Arc<Session>,
    pub(crate) name: LockName,
    pub(crate) parent: String,
    pub(crate) path: String,
    pub(crate) guid: Uuid,
    pub(crate) fence: FencingToken,
    /// A create of this owner had its reply lost, so a second node with the
    /// same uuid may exist: release sweeps the parent for it.
    pub(crate) strays: bool,
    /// The parent watch this node was created under, and the node's
    /// sequence number, if it was granted alone in the queue: once released,
    /// the session vouches for the next number (see [`crate::quiet`]).
    pub(crate) vouch: Option<(u64, u32)>,
    /// The lease's loss signal: cancelled when the node is deleted by anyone
    /// else or the session ends (it is a child of the session's signal).
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
    /// Records a grant with local deadline `deadline`; the session's keeper
    /// starts watching it if it is still held a while later.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        session: Arc<Session>,
        name: LockName,
        parent: String,
        path: String,
        guid: Uuid,
        fence: FencingToken,
        strays: bool,
        vouch: Option<(u64, u32)>,
        deadline: Instant,
    ) -> Arc<Held> {
        let held = Arc::new(Held {
            lost: session.ended.child_token(),
            session,
            name,
            parent,
            path,
            guid,
            fence,
            strays,
            vouch: vouch.filter(|_| !strays),
            done: CancellationToken::new(),
            state: Mutex::new(State {
                deadline,
                over: Over::No,
                releasing: false,
            }),
        });
        held.session.keeper.add(held.clone());
        held
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How the grant stands.
    pub(crate) fn over(&self) -> Over {
        self.lock().over
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

    /// Marks the grant expired if its deadline has passed `now`.
    pub(crate) fn expire_if_due(&self, now: Instant) -> bool {
        let mut state = self.lock();
        if state.over == Over::No && now >= state.deadline {
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

    /// Deletes this node (and, after a lost create reply, any stray node of
    /// the same owner). `Ok(true)` if this call deleted the node.
    pub(crate) async fn delete(&self) -> Result<bool, zk::Error> {
        let deleted = queue::delete_node(&self.session.client, &self.path).await;
        if self.strays {
            queue::sweep_owner(&self.session.client, &self.parent, self.guid).await;
        }
        deleted
    }

    /// Stops watching (after a release).
    pub(crate) fn stop(&self) {
        self.done.cancel();
    }
}

/// Grants to start watching once they have been held for a while: one task
/// per session looks at each grant a twentieth of the session timeout after
/// it was made (a quarter of that later at most) and starts [`watch_over`]
/// it if it is still held. A short hold costs no task, no timer and no
/// wake-up; until then (and on any trouble) renewals notice a deletion, and
/// the local deadline is far off.
pub(crate) struct Keeper {
    /// Grants in the order they were made, with when to look at them (that
    /// order, since the delay is the same for all).
    due: Mutex<VecDeque<(Instant, Arc<Held>)>>,
    added: Notify,
    delay: Duration,
}

impl Keeper {
    /// How long after a grant the keeper looks at it: a twentieth of the
    /// session timeout.
    fn delay(timeout: Duration) -> Duration {
        timeout / 20
    }

    /// The latest a grant is watched (or found deleted) after it was made:
    /// the delay plus the keeper's rest of a quarter of it. A forced release
    /// reaches a connected holder within this, plus one trip from the
    /// server: the deletion event of a watched node, or the look that finds
    /// it gone.
    pub(crate) fn watched_within(timeout: Duration) -> Duration {
        Self::delay(timeout) * 5 / 4
    }

    /// Starts the keeper of a session with timeout `timeout`, which stops
    /// when `ended` fires.
    pub(crate) fn start(timeout: Duration, ended: CancellationToken) -> Arc<Keeper> {
        let keeper = Arc::new(Keeper {
            due: Mutex::new(VecDeque::new()),
            added: Notify::new(),
            delay: Self::delay(timeout),
        });
        tokio::spawn(keep(keeper.clone(), ended));
        keeper
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<(Instant, Arc<Held>)>> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, held: Arc<Held>) {
        let mut due = self.lock();
        let was_empty = due.is_empty();
        due.push_back((Instant::now() + self.delay, held));
        drop(due);
        if was_empty {
            self.added.notify_one();
        }
    }

    /// The first grant due by `now`.
    fn pop_due(&self, now: Instant) -> Option<Arc<Held>> {
        let mut due = self.lock();
        match due.front() {
            Some((at, _)) if *at <= now => due.pop_front().map(|(_, held)| held),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("due", &self.lock().len())
            .finish_non_exhaustive()
    }
}

async fn keep(keeper: Arc<Keeper>, ended: CancellationToken) {
    // Looks at most four times per delay, whatever the rate of grants: a
    // grant is looked at between one and one and a quarter delays after it
    // was made.
    let mut rest_until = Instant::now();
    loop {
        let next = keeper.lock().front().map(|&(at, _)| at.max(rest_until));
        tokio::select! {
            biased;
            _ = ended.cancelled() => break,
            // `notify_one` leaves a permit if it comes before this waits.
            _ = keeper.added.notified(), if next.is_none() => continue,
            _ = sleep_until_some(next) => {}
        }
        let now = Instant::now();
        rest_until = now + keeper.delay / 4;
        while let Some(held) = keeper.pop_due(now) {
            if held.over() == Over::No {
                tokio::spawn(watch_over(held));
            }
        }
    }
    // The session's nodes are gone with it; so are the grants' loss signals.
    keeper.lock().clear();
}

/// Watches a granted node until it is released, expires (then deletes it:
/// an abandoned lease must not outlive its deadline just because the session
/// does), or is deleted by someone else (then fires the loss signal).
async fn watch_over(held: Arc<Held>) {
    let mut registering: Option<BoxFuture<'static, Registered>> =
        Some(watch(held.session.client.clone(), held.path.clone()));
    let mut fired: Option<BoxFuture<'static, zk::WatchedEvent>> = None;
    loop {
        let deadline = held.lock().deadline;
        tokio::select! {
            biased;
            _ = held.done.cancelled() => return,
            registered = poll_some(&mut registering) => {
                registering = None;
                match registered {
                    Ok((Some(_), watcher)) => fired = Some(Box::pin(watcher.changed())),
                    Ok((None, _)) => return deleted(&held),
                    // Connection trouble: try again (the request waits for
                    // the reconnection); the deadline bounds the grant anyway.
                    Err(e) if crate::error::transient(&e) && !held.session.is_ended() => {
                        tracing::debug!(path = %held.path, error = %e, "watching a granted lock node failed; again");
                        registering = Some(watch(held.session.client.clone(), held.path.clone()));
                    }
                    Err(e) => tracing::debug!(path = %held.path, error = %e, "could not watch a granted lock node"),
                }
            }
            event = poll_some(&mut fired) => {
                fired = None;
                if event.event_type == zk::EventType::NodeDataChanged {
                    // Someone wrote to the node (no ACL in use): watch again.
                    registering = Some(watch(held.session.client.clone(), held.path.clone()));
                } else {
                    return deleted(&held);
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                if held.expire_if_due(Instant::now()) {
                    tracing::debug!(name = %held.name, fence = %held.fence, "lease passed its deadline unrenewed; deleting its node");
                    if let Err(e) = held.delete().await {
                        tracing::debug!(path = %held.path, error = %e, "could not delete an expired lock node; its session will");
                    }
                    return;
                }
                if held.over() != Over::No {
                    return;
                }
            }
        }
    }
}

type Registered = Result<(Option<zk::Stat>, zk::OneshotWatcher), zk::Error>;

fn watch(client: zk::Client, path: String) -> BoxFuture<'static, Registered> {
    Box::pin(async move { client.check_and_watch_stat(&path).await })
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn poll_some<T>(slot: &mut Option<BoxFuture<'static, T>>) -> T {
    match slot {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// The watched node was deleted: released by its owner, or gone.
fn deleted(held: &Held) {
    if held.lock().releasing {
        held.finish(Over::Released);
    } else {
        gone(held);
    }
}

/// The node is gone (forced release, session end) and not by our own hand.
pub(crate) fn gone(held: &Held) {
    if held.finish(Over::Gone) {
        tracing::debug!(name = %held.name, fence = %held.fence, "lock node deleted by someone else or its session ended");
        held.lost.cancel();
    }
}
