//! Waiting in a lock's queue, as a [`Waiter`] for lockcore's wait loop: the
//! node stays in line across attempts (FIFO), and each attempt asks whether
//! it is first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use lockcore::backend::{LockRequest, Moment, Waiter, Wakeup};
use lockcore::{Attempt, LockError};
use tokio::sync::oneshot;
use zookeeper_client as zk;

use crate::client::{Client, Live};
use crate::error::map;
use crate::names::{NodeData, Queue};
use crate::queue::Entry;

/// One `acquire`'s place in line. Dropping it removes its node.
pub(crate) struct LineWaiter<'a> {
    client: &'a Client,
    request: &'a LockRequest,
    place: Option<Place>,
    /// Where the attempt hands the armed wake-up its watch.
    watching: Option<oneshot::Sender<Wakeup>>,
}

/// A node in line and what this waiter last knew of the queue.
struct Place {
    live: Arc<Live>,
    entry: Entry,
    queue: Queue,
    /// The send time of this entry's latest request that went through the
    /// leader: the create (a write), then each synced listing.
    alive_since: Moment,
    /// Set by the armed wake-up when the node just ahead was deleted.
    ahead_gone: Arc<AtomicBool>,
}

impl<'a> LineWaiter<'a> {
    pub(crate) fn new(client: &'a Client, request: &'a LockRequest) -> Self {
        LineWaiter {
            client,
            request,
            place: None,
            watching: None,
        }
    }

    /// Queues a new node (on the live session).
    async fn enqueue(&self) -> Result<Place, LockError> {
        let live = self.client.live().await?;
        let parent = self.client.lock_path(self.request.name());
        let data = NodeData::new(self.request.label());
        let mut entry = Entry::new(
            live.session.clone(),
            parent,
            self.client.acls.clone(),
            &data,
        );
        let alive_since = Moment::now();
        let queue = entry.enqueue().await?;
        Ok(Place {
            live,
            entry,
            queue,
            alive_since,
            ahead_gone: Arc::default(),
        })
    }

    /// Brings `place` up to date (a synced listing, unless the node ahead is
    /// known gone), and says whether it is first.
    async fn look(&self, place: &mut Place) -> Result<Option<bool>, LockError> {
        let ours = place.entry.name().unwrap_or_default();
        // Nodes ahead of ours only ever go away (sequence numbers grow), so
        // once the only node ahead is gone, we are first: no read needed, as
        // long as the leader heard of the session recently enough to leave a
        // useful deadline.
        let next_in_line = place.queue.position(ours) == Some(1);
        let fresh = Moment::now().since(place.alive_since) <= self.client.session_timeout() / 4;
        if next_in_line && fresh && place.ahead_gone.load(Ordering::Relaxed) {
            return Ok(Some(false));
        }
        // Synced: the listing's send time becomes the grant's start, which
        // only a request through the leader can vouch for (a cut-off
        // follower answers plain reads for a while).
        let sent = Moment::now();
        place.queue = place.entry.relist(true).await?;
        place.alive_since = sent;
        self.first(place).await
    }

    /// Whether our node is first (`Some(alone)`), after deleting strays of
    /// ours ahead of it; `None` when it is not.
    async fn first(&self, place: &mut Place) -> Result<Option<bool>, LockError> {
        if let Some(fresh) = place.entry.prune(&place.queue).await? {
            place.queue = fresh;
        }
        let ours = place.entry.name().unwrap_or_default();
        Ok((place.queue.position(ours) == Some(0)).then(|| place.queue.is_only(ours)))
    }

    fn grant(&self, place: Place, alone: bool) -> Result<Attempt, LockError> {
        let Place {
            live,
            entry,
            alive_since,
            ..
        } = place;
        let lease = self
            .client
            .grant(&live, self.request.name(), entry, alive_since, alone)?;
        Ok(Attempt::Acquired(lease))
    }
}

#[async_trait::async_trait]
impl Waiter for LineWaiter<'_> {
    /// A wake-up for the coming attempt: the node just ahead of ours, which
    /// the attempt watches if it finds ours behind it (one waiter wakes per
    /// release).
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        let (watching, watched) = oneshot::channel::<Wakeup>();
        self.watching = Some(watching);
        Ok(Some(Box::pin(async move {
            if let Ok(wakeup) = watched.await {
                wakeup.await;
            }
        })))
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        if (self.place.as_ref()).is_some_and(|p| p.live.session.is_ended()) {
            self.place = None;
        }
        let (place, first) = match self.place.take() {
            None => {
                let mut place = self.enqueue().await?;
                let first = self.first(&mut place).await;
                (place, first)
            }
            Some(mut place) => {
                let first = self.look(&mut place).await;
                (place, first)
            }
        };
        match first {
            Ok(Some(alone)) => self.grant(place, alone),
            Ok(None) => {
                let ours = place.entry.name().unwrap_or_default();
                // Our node is gone (its session ended, or it was deleted by
                // hand): queue again next time.
                if place.queue.position(ours).is_some() {
                    let wakeup = watch_ahead(&place).await;
                    self.place = Some(place);
                    if let Some(watching) = self.watching.take() {
                        let _ = watching.send(wakeup?);
                    }
                }
                Ok(Attempt::Held { expires_in: None })
            }
            // Keep the place in line through transient trouble.
            Err(e) => {
                self.place = Some(place);
                Err(e)
            }
        }
    }
}

/// Watches the node just ahead of ours; the wake-up marks it gone when it
/// was deleted. An `exists` is answered by our server alone: it does not
/// move `alive_since`.
async fn watch_ahead(place: &Place) -> Result<Wakeup, LockError> {
    let ours = place.entry.name().unwrap_or_default();
    let gone = place.ahead_gone.clone();
    gone.store(false, Ordering::Relaxed);
    let Some(ahead) = place.queue.predecessor(ours) else {
        return Ok(Box::pin(async {}));
    };
    let path = format!("{}/{}", place.entry.parent, ahead.name);
    let ended = place.live.session.ended.clone();
    match place.live.session.client.check_and_watch_stat(&path).await {
        Ok((Some(_), watcher)) => Ok(Box::pin(async move {
            tokio::select! {
                event = watcher.changed() => {
                    gone.store(event.event_type == zk::EventType::NodeDeleted, Ordering::Relaxed);
                }
                _ = ended.cancelled() => {}
            }
        })),
        Ok((None, _)) => {
            gone.store(true, Ordering::Relaxed);
            Ok(Box::pin(async {}))
        }
        Err(e) => Err(map(format!("watching {path}"), e)),
    }
}
