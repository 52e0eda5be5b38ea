//! The task that keeps a [`Line`]'s view: it lists the queue, or watches
//! the node ahead of the first local waiter, and tells that waiter when it
//! is first.

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
/// one kept (so that shutting the session is not held up), and its end.
pub(super) struct Link {
    pub(super) session: Weak<Session>,
    pub(super) ended: CancellationToken,
    pub(super) states: zk::StateWatcher,
}

impl Link {
    /// A handle for one request; `ClientClosed` once the session is shut.
    fn client(&self) -> Result<zk::Client, zk::Error> {
        let session = self.session.upgrade().ok_or(zk::Error::ClientClosed)?;
        session.client()
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
    // The node watched, and its watch (kept while it stays the one to watch).
    let mut watching: Option<(u32, Fired)> = None;
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
                let listed = match syncing.await {
                    Ok(()) | Err(zk::Error::NoNode) => listing.await,
                    Err(e) => Err(e),
                };
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
            (Step::Watch(sequence, path), Some(client)) => {
                let kept = watching.take().filter(|(s, _)| *s == sequence);
                let fired = match kept {
                    Some((_, fired)) => Ok(Some(fired)),
                    None => match client.check_and_watch_stat(&path).await {
                        Ok((Some(_), watcher)) => Ok(Some(Box::pin(watcher.changed()) as Fired)),
                        Ok((None, _)) => Ok(None),
                        Err(e) => Err(e),
                    },
                };
                // No handle is kept while waiting: it would hold up a close.
                drop(client);
                match fired {
                    Ok(None) => {
                        live.passed(sequence);
                        Ok(())
                    }
                    Ok(Some(mut fired)) => {
                        drop(live);
                        tokio::select! {
                            biased;
                            event = &mut fired => match event.event_type {
                                // Gone (a node kept by `set_remaining` is
                                // written to first: `NodeDataChanged`).
                                zk::EventType::NodeDeleted => {
                                    if let Some(live) = line.upgrade() {
                                        live.passed(sequence);
                                    }
                                    Ok(())
                                }
                                zk::EventType::Session if event.session_state.is_terminated() => {
                                    Err(zk::Error::SessionExpired)
                                }
                                // Written to, or a session event: watch again.
                                _ => Ok(()),
                            },
                            _ = poke.notified() => {
                                watching = Some((sequence, fired));
                                Ok(())
                            }
                            e = link.ended() => Err(e),
                        }
                    }
                    Err(e) => Err(e),
                }
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
