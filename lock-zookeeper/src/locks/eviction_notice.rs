//! Eviction notices: the grants a session holds for a while are watched, so
//! a forced release (someone else deleting the node) reaches the holder as
//! its lease's loss signal within the declared `eviction_notice`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lockcore::backend::CancellationToken;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use zookeeper_client as zk;

use crate::locks::held::{Held, Over, deleted};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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
    /// The session's tasks: the keeper's own and its watches.
    tasks: TaskTracker,
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

    /// Starts the keeper of a session with timeout `timeout` among the
    /// session's `tasks`; it stops when `losing` fires (the session ended,
    /// or its client is closed: every grant's loss signal fired).
    pub(crate) fn start(
        timeout: Duration,
        losing: CancellationToken,
        tasks: &TaskTracker,
    ) -> Arc<Keeper> {
        let keeper = Arc::new(Keeper {
            due: Mutex::new(VecDeque::new()),
            added: Notify::new(),
            delay: Self::delay(timeout),
            tasks: tasks.clone(),
        });
        tasks.spawn(keep(keeper.clone(), losing));
        keeper
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<(Instant, Arc<Held>)>> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks at `held` a twentieth of the session timeout from now.
    pub(crate) fn add(&self, held: Arc<Held>) {
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

async fn keep(keeper: Arc<Keeper>, losing: CancellationToken) {
    // Looks at most four times per delay, whatever the rate of grants: a
    // grant is looked at between one and one and a quarter delays after it
    // was made.
    let mut rest_until = Instant::now();
    loop {
        let next = keeper.lock().front().map(|&(at, _)| at.max(rest_until));
        tokio::select! {
            biased;
            _ = losing.cancelled() => break,
            // `notify_one` leaves a permit if it comes before this waits.
            _ = keeper.added.notified(), if next.is_none() => continue,
            _ = sleep_until_some(next) => {}
        }
        let now = Instant::now();
        rest_until = now + keeper.delay / 4;
        while let Some(held) = keeper.pop_due(now) {
            if held.over() == Over::No {
                keeper.tasks.spawn(watch_over(held));
            }
        }
    }
    // The session's nodes are gone with it; so are the grants' loss signals.
    keeper.lock().clear();
}

/// Watches a granted node until it is released, expires (then deletes it:
/// an abandoned lease must not outlive its deadline just because the session
/// does), or is deleted by someone else (then fires the loss signal). The
/// watch is the grant's ([`Held::watching`]): renewals rely on it too. Ends
/// with the loss signal, too (the session ended, or its client is closed).
async fn watch_over(held: Arc<Held>) {
    let mut registering: Option<BoxFuture<'static, Registered>> = Some(watch(&held));
    loop {
        let deadline = held.deadline();
        tokio::select! {
            biased;
            _ = held.stopped() => return,
            _ = held.lost.cancelled() => return,
            registered = poll_some(&mut registering) => {
                registering = None;
                match registered {
                    Ok((Some(_), watcher)) => held.watching(Instant::now(), Box::pin(watcher.changed())),
                    Ok((None, _)) => return deleted(&held),
                    // Connection trouble: try again (the request waits for
                    // the reconnection); the deadline bounds the grant anyway.
                    Err(e) if crate::error::transient(&e) && !held.session.is_ended() => {
                        tracing::debug!(path = %held.path, error = %e, "watching a granted lock node failed; again");
                        registering = Some(watch(&held));
                    }
                    Err(e) => tracing::debug!(path = %held.path, error = %e, "could not watch a granted lock node"),
                }
            }
            event = std::future::poll_fn(|cx| held.poll_watch(cx)) => {
                if event.event_type == zk::EventType::NodeDataChanged {
                    // Someone wrote to the node (no ACL in use): watch again.
                    registering = Some(watch(&held));
                } else {
                    return deleted(&held);
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                if held.expire_if_due(Instant::now()) {
                    tracing::debug!(name = %held.name, fence = %held.fence, "lease passed its deadline unrenewed; deleting its node");
                    return held.delete_expired().await;
                }
                // Ended, or being kept (which deletes it if it fails late).
                if held.over() != Over::No || held.is_keeping() {
                    return;
                }
            }
        }
    }
}

type Registered = Result<(Option<zk::Stat>, zk::OneshotWatcher), zk::Error>;

/// Sets a watch on `held`'s node (an `exists`).
fn watch(held: &Held) -> BoxFuture<'static, Registered> {
    let (client, path) = (held.session.client(), held.path.clone());
    Box::pin(async move { client?.check_and_watch_stat(&path).await })
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
