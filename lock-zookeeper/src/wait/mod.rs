//! Waiting in a lock's queue, as a [`Waiter`] for lockcore's wait loop: the
//! node stays in line across attempts (FIFO), and each attempt asks the
//! session's shared view of the queue ([`Line`]) whether it is first. Waiting
//! costs no request of its own: a waiter is woken when it may be first, and
//! reads nothing but that view until then. A reader-writer lock's read or
//! write waits the same way in its queue ([`crate::rw`]): a read is "first"
//! once only reads are ahead of it, and a waiting writer's node is the
//! intent that keeps later readers out.

pub(crate) mod line;

use std::sync::Arc;

use lockcore::backend::LockRequest;
use lockcore::backend::wait::{Waiter, Wakeup};
use lockcore::{Access, Attempt, LockError};
use tokio::sync::Notify;

use crate::connection::requests::delete_node;
use crate::connection::{Client, Live};
use crate::error::{BACKEND, map, vanished};
use crate::locks::queue::Entry;
use line::{Line, Place, Turn};

/// One `acquire`'s place in line. Dropping it removes its node.
pub(crate) struct LineWaiter<'a> {
    client: &'a Client,
    request: &'a LockRequest,
    /// Told when our node may be first (or is gone), or the view ended.
    woken: Arc<Notify>,
    queued: Option<Queued>,
}

/// A node in line.
struct Queued {
    live: Arc<Live>,
    line: Arc<Line>,
    entry: Entry,
    sequence: u32,
    _turn: Turn,
}

/// What queueing did.
enum Joined {
    /// The create showed the node first.
    First {
        live: Arc<Live>,
        entry: Entry,
        alone: bool,
    },
    /// The node waits in the view.
    InLine(Queued),
}

/// What an attempt found.
enum Found {
    /// First in line.
    First { alone: bool },
    /// Still behind someone (or not listed yet).
    Waiting,
    /// Our node is gone (its session ended, or it was deleted by hand).
    Gone,
}

impl<'a> LineWaiter<'a> {
    pub(crate) fn new(client: &'a Client, request: &'a LockRequest) -> Self {
        LineWaiter {
            client,
            request,
            woken: Arc::new(Notify::new()),
            queued: None,
        }
    }

    /// Queues a node behind the session's view of the queue, unless the
    /// create alone shows it first (admitted): the sequence proof
    /// ([`crate::locks::quiet`]), or a listing sent with the create when
    /// nobody of this session waits here (as `try_acquire` does). Either
    /// saves the view's listing.
    async fn join(&self) -> Result<Joined, LockError> {
        let live = self.client.live().await?;
        let parent = self.client.queue_path(self.request);
        let session = &live.session;
        let line = session.lines.line(session, &parent);
        let (acls, cleanups) = (self.client.acls.clone(), self.client.cleanups.clone());
        let mut entry = Entry::new(session.clone(), parent, acls, cleanups, Some(self.request));
        let probe = line.probe();
        let mut queue = entry.enqueue(probe.is_some()).await?;
        drop(probe);
        if let Some(listed) = queue.take() {
            let listed = entry.prune(&listed).await?.unwrap_or(listed);
            if let Some(ours) = entry.name().filter(|&n| listed.admits(n, entry.access)) {
                let alone = listed.is_only(ours);
                if !entry.ready().await? {
                    return Err(vanished(self.request.name()));
                }
                return Ok(Joined::First { live, entry, alone });
            }
            queue = Some(listed);
        }
        let sequence = entry
            .sequence()
            .ok_or_else(|| LockError::store(BACKEND, "a created queue node has no sequence"))?;
        let reads = entry.access == Some(Access::Read);
        // The listing read with the create is the view's: no second one.
        let turn = line.join(
            (sequence, entry.guid),
            reads,
            self.woken.clone(),
            entry.clock.clone(),
            queue.as_ref(),
        );
        Ok(Joined::InLine(Queued {
            live,
            line,
            entry,
            sequence,
            _turn: turn,
        }))
    }

    /// Where our node stands. When first, the lease starts at the latest
    /// request through the leader that also proves the node alive: our
    /// create, or the `sync` the view's listing was read behind. That must be
    /// recent (the leader heard of the session recently enough to leave a
    /// useful deadline), else a `sync` is sent now
    /// ([`Entry::prove_recent`]): only a request through the leader can
    /// start a lease (a cut-off follower answers reads for a while, and its
    /// view may be late). A reader-writer lock's node takes its fence
    /// instead, a write that starts the lease ([`Entry::ready`]).
    async fn look(&self, queued: &mut Queued) -> Result<Found, LockError> {
        let alone = match queued.line.place(queued.sequence) {
            Place::First { alone, synced } => {
                if let Some(synced) = synced {
                    queued.entry.seen_alive(synced);
                }
                alone
            }
            Place::Behind => {
                if queued.entry.strays {
                    self.prune(queued).await?;
                }
                return Ok(Found::Waiting);
            }
            Place::Unknown => return Ok(Found::Waiting),
            Place::Missing => return Ok(Found::Gone),
        };
        if !queued.entry.ready().await? {
            return Ok(Found::Gone);
        }
        Ok(Found::First { alone })
    }

    /// After a lost create reply, a create sent through the old connection
    /// may still land after we looked, ahead of the node we made instead:
    /// such a stray of ours would block us (and everyone behind us).
    async fn prune(&self, queued: &Queued) -> Result<(), LockError> {
        let guid = queued.entry.guid;
        for stray in queued.line.strays_ahead(guid, queued.sequence) {
            let path = format!("{}/{stray}", queued.entry.parent);
            tracing::debug!(%path, "deleting a stray queue node of ours ahead of ours");
            let client =
                (queued.live.session.client()).map_err(|e| map(format!("deleting {path}"), e))?;
            delete_node(&client, &path)
                .await
                .map_err(|e| map(format!("deleting {path}"), e))?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Waiter for LineWaiter<'_> {
    /// Our turn's wake-up: registered with the view when the node was
    /// queued, and left armed by a wake-up that came before this round.
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        let woken = self.woken.clone();
        Ok(Some(Box::pin(async move { woken.notified().await })))
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        if (self.queued.as_ref()).is_some_and(|q| q.live.session.is_ended()) {
            self.queued = None;
        }
        let name = self.request.name();
        // Each step's requests are cut at the session timeout (a request
        // lost on a connection that lives on is never answered): a
        // `Unavailable` the wait loop retries, keeping the place in line
        // (a cut join drops its entry, whose node is removed in the
        // background).
        let client = self.client;
        let mut queued = match self.queued.take() {
            Some(queued) => queued,
            None => match client.bounded("queueing for", name, self.join()).await? {
                Joined::InLine(queued) => queued,
                Joined::First { live, entry, alone } => {
                    let lease = client.grant(&live, name, entry, alone)?;
                    return Ok(Attempt::Acquired(lease));
                }
            },
        };
        match (client.bounded("waiting in line for", name, self.look(&mut queued))).await {
            Ok(Found::First { alone }) => {
                // A fence floor raised while we waited: our node's fence
                // (its czxid plus the offset it was created with) may be
                // below it. Queue again behind the raise (the place in line
                // is lost), never grant under it. (A reader-writer lock's
                // node took its fence just now, under the floor in force.)
                let created_with = queued.entry.node.as_ref().map(|n| n.offset);
                let floor = queued.live.session.floor_offset();
                match client
                    .bounded("reading the fence floor for", name, floor)
                    .await
                {
                    Ok(Some(offset)) if Some(offset) == created_with => {}
                    Ok(_) => {
                        tracing::debug!(%name, "the fence floor was raised while waiting; queueing again");
                        let Queued { entry, .. } = queued;
                        let leaving = client.bounded("leaving the line of", name, entry.remove());
                        if let Err(e) = leaving.await {
                            tracing::debug!(%name, error = %e, "could not remove a queue node now; retrying in the background");
                        }
                        self.woken.notify_one();
                        return Ok(Attempt::Held { expires_in: None });
                    }
                    Err(e) => {
                        self.queued = Some(queued);
                        return Err(e);
                    }
                }
                let Queued { live, entry, .. } = queued;
                let lease = client.grant(&live, name, entry, alone)?;
                Ok(Attempt::Acquired(lease))
            }
            Ok(Found::Waiting) => {
                self.queued = Some(queued);
                Ok(Attempt::Held { expires_in: None })
            }
            Ok(Found::Gone) => {
                // Queue again, right away.
                self.woken.notify_one();
                Ok(Attempt::Held { expires_in: None })
            }
            // Keep the place in line through transient trouble.
            Err(e) => {
                self.queued = Some(queued);
                Err(e)
            }
        }
    }
}
