//! The task that keeps a [`Line`]'s view: it lists the queue, or watches
//! the node ahead of the first local waiter (and the next one ahead of that,
//! to list the queue before, not after, the release that makes the waiter
//! first), and tells that waiter when it is first.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use lockcore::Backoff;
use lockcore::backend::{CancellationToken, Clock};
use tokio::sync::Notify;
use zookeeper_client as zk;

use super::{Line, Step};
use crate::connection::session::Session;
use crate::error::{map, transient};

type Fired = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// What a line's task knows of its session: a handle per request, never
/// one kept (so that shutting the session is not held up), its end, and
/// its timeout, which cuts each of the task's requests: one the server
/// never got while the connection stayed up (seen with a proxy that dropped
/// it) would wait for its reply as long as the session lives, and the view
/// would stall for every local waiter (see `requests::until_cleaned`).
pub(super) struct Link {
    pub(super) session: Weak<Session>,
    pub(super) ended: CancellationToken,
    pub(super) states: zk::StateWatcher,
    pub(super) timeout: Duration,
}

impl Link {
    /// A handle for one request; `ClientClosed` once the session is shut.
    fn client(&self) -> Result<zk::Client, zk::Error> {
        let session = self.session.upgrade().ok_or(zk::Error::ClientClosed)?;
        session.client()
    }

    /// `request`, cut at the session timeout (`Timeout`: tried again).
    async fn cut<T>(
        &self,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, zk::Error> {
        tokio::time::timeout(self.timeout, request)
            .await
            .unwrap_or(Err(zk::Error::Timeout))
    }

    /// Completes when the session ended (or was retired, or shut).
    async fn ended(&mut self) -> zk::Error {
        loop {
            tokio::select! {
                _ = self.ended.cancelled() => return zk::Error::SessionExpired,
                state = self.states.changed() => if state.is_terminated() {
                    return zk::Error::SessionExpired;
                },
            }
        }
    }
}

/// Whether `a` and `b` are the same clock (the same allocation).
pub(super) fn same_clock(a: &Arc<dyn Clock>, b: &Arc<dyn Clock>) -> bool {
    std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

/// Keeps the view: lists the queue (behind a `sync`, in the same round
/// trip) when a waiter joined since the last listing, else watches the node
/// ahead of the first local waiter. Stops with the line or the session.
pub(super) async fn run(line: Weak<Line>, poke: Arc<Notify>, mut link: Link, parent: String) {
    let backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    let mut failures = 0;
    // The nodes watched, and their watches (kept while they stay ones to
    // watch).
    let mut kept: HashMap<u32, Fired> = HashMap::new();
    loop {
        let Some(live) = line.upgrade() else {
            return;
        };
        let step = live.next_step();
        let client = match (&step, link.client()) {
            (Step::Stop | Step::Rest, _) => None,
            (_, Ok(client)) => Some(client),
            (_, Err(e)) => {
                live.end(map(format!("watching the queue {parent}"), e).to_string());
                return;
            }
        };
        let outcome = match (step, client) {
            (Step::Stop, _) => return,
            (Step::Rest, _) => {
                drop(live);
                tokio::select! {
                    _ = poke.notified() => continue,
                    e = link.ended() => Err(e),
                }
            }
            (_, None) => continue,
            (Step::List(number, clock), Some(client)) => {
                drop(live);
                let synced = clock.map(|clock| (clock.now(), clock));
                let syncing = client.sync(&parent);
                let listing = client.list_children(&parent);
                let listed = link
                    .cut(async {
                        match syncing.await {
                            Ok(()) | Err(zk::Error::NoNode) => listing.await,
                            Err(e) => Err(e),
                        }
                    })
                    .await;
                match listed {
                    Ok(children) => Ok((number, children, synced)),
                    Err(zk::Error::NoNode) => Ok((number, Vec::new(), synced)),
                    Err(e) => Err(e),
                }
                .map(|(number, children, synced)| {
                    if let Some(live) = line.upgrade() {
                        live.install(number, children, synced);
                    }
                })
            }
            (Step::Watch(near, path, far), Some(client)) => {
                watch_step(
                    live,
                    &line,
                    client,
                    (near, path),
                    far,
                    &mut kept,
                    &poke,
                    &mut link,
                )
                .await
            }
        };
        match outcome {
            Ok(()) => failures = 0,
            Err(e) => {
                let Some(live) = line.upgrade() else {
                    return;
                };
                if !transient(&e)
                    || matches!(e, zk::Error::SessionExpired | zk::Error::ClientClosed)
                {
                    live.end(map(format!("watching the queue {parent}"), e).to_string());
                    return;
                }
                drop(live);
                tokio::time::sleep(backoff.delay(failures)).await;
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// Watches `near`, the node just ahead of the first local waiter, and
/// `far`, the next one ahead that keeps it waiting, until one of them
/// changes, the task is poked, or the session ends. Watches still pending
/// go back to `kept`.
#[allow(clippy::too_many_arguments)]
async fn watch_step(
    live: Arc<Line>,
    line: &Weak<Line>,
    client: zk::Client,
    (near, path): (u32, String),
    far: Option<(u32, String)>,
    kept: &mut HashMap<u32, Fired>,
    poke: &Notify,
    link: &mut Link,
) -> Result<(), zk::Error> {
    let (near_kept, far_kept) = (
        kept.remove(&near),
        far.as_ref().and_then(|(s, _)| kept.remove(s)),
    );
    // Watches of nodes no longer to watch are dropped.
    kept.clear();
    let Some(mut fired) = link.cut(watch(&client, near_kept, &path)).await? else {
        live.passed(near);
        return Ok(());
    };
    let (far, mut beyond) = match far {
        None => (None, Box::pin(std::future::pending()) as Fired),
        Some((sequence, far_path)) => match link.cut(watch(&client, far_kept, &far_path)).await {
            Ok(Some(beyond)) => (Some(sequence), beyond),
            outcome => {
                kept.insert(near, fired);
                outcome?;
                live.passed_far(sequence, near);
                return Ok(());
            }
        },
    };
    // No handle is kept while waiting: it would hold up a close.
    drop(client);
    drop(live);
    tokio::select! {
        biased;
        event = &mut fired => {
            if gone(&event)?
                && let Some(live) = line.upgrade()
            {
                live.passed(near);
            }
            if let Some(far) = far {
                kept.insert(far, beyond);
            }
            Ok(())
        }
        event = &mut beyond => {
            kept.insert(near, fired);
            if gone(&event)?
                && let (Some(far), Some(live)) = (far, line.upgrade())
            {
                live.passed_far(far, near);
            }
            Ok(())
        }
        _ = poke.notified() => {
            kept.insert(near, fired);
            if let Some(far) = far {
                kept.insert(far, beyond);
            }
            Ok(())
        }
        e = link.ended() => Err(e),
    }
}

/// The `exists` watch on the node at `path` (`kept`, if set before):
/// `None` if the node is gone.
async fn watch(
    client: &zk::Client,
    kept: Option<Fired>,
    path: &str,
) -> Result<Option<Fired>, zk::Error> {
    if let Some(fired) = kept {
        return Ok(Some(fired));
    }
    match client.check_and_watch_stat(path).await? {
        (Some(_), watcher) => Ok(Some(Box::pin(watcher.changed()))),
        (None, _) => Ok(None),
    }
}

/// Whether a watched node's event says it is gone. A node kept by
/// `set_remaining` (or created again by a reader-writer grant) is written
/// to first (`NodeDataChanged`): watch it again, as after a session event.
fn gone(event: &zk::WatchedEvent) -> Result<bool, zk::Error> {
    match event.event_type {
        zk::EventType::NodeDeleted => Ok(true),
        zk::EventType::Session if event.session_state.is_terminated() => {
            Err(zk::Error::SessionExpired)
        }
        _ => Ok(false),
    }
}
