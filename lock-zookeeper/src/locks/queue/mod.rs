//! A place in a lock's queue: the ephemeral sequential node, created in
//! protected mode, and removed again by whoever gives it up, including a
//! dropped future.

use std::sync::Arc;

use lockcore::backend::{Cleanups, Clock, LockRequest, Moment, SystemClock};
use lockcore::{Access, FencingToken, HolderLabel, LockError};
use uuid::Uuid;
use zookeeper_client as zk;

use crate::connection::requests::{ATTEMPTS, delete_node, list, retry, sweep_owner, until_cleaned};
use crate::connection::session::Session;
use crate::error::{BACKEND, connection_lost, map};
use crate::fence::floor::floor_raised;
use crate::keys::acls::Acls;
use crate::keys::names::{NodeData, Queue, QueueNode, node_prefix};

/// Our node, once we know it.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) path: String,
    pub(crate) czxid: i64,
    /// Its sequence number (as the queue orders them), if the create told us.
    pub(crate) sequence: Option<u32>,
    /// The fence floor's offset it was created with (in force then).
    pub(crate) offset: u64,
    /// The send time of the latest request through the leader (a write or
    /// a `sync`) that showed the node alive: its create, the `sync` behind
    /// the listing that found it after a lost create reply, or a later one,
    /// read on the entry's clock before that request was sent. A lease from
    /// this node starts here (see [`Entry::prove_recent`]).
    pub(crate) alive_since: Moment,
}

impl Node {
    /// The node's fence: its `czxid` plus its offset.
    pub(crate) fn fence(&self) -> Result<FencingToken, LockError> {
        NodeData::new(None, self.offset).fence(self.czxid)
    }
}

/// A queue entry being created or waiting. Dropping it while armed removes
/// its node in the background (through the client's [`Cleanups`], which
/// closing the client finishes), so a cancelled acquire never blocks others.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) session: Arc<Session>,
    pub(crate) parent: String,
    pub(crate) guid: Uuid,
    /// The clock of the request: the node's proofs of life are read on it,
    /// and its lease is judged on it.
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) acls: Arc<Acls>,
    cleanups: Cleanups,
    /// The label the node is created with.
    pub(crate) label: Option<HolderLabel>,
    /// A reader-writer lock's read or write node (`None`: a lock's, or a
    /// semaphore slot's), as the request asks.
    pub(crate) access: Option<Access>,
    pub(crate) node: Option<Node>,
    /// A create's reply was lost: a second node of ours may show up.
    pub(crate) strays: bool,
    /// The session's watch on the parent, set before our node was created
    /// or while it existed (see [`crate::locks::quiet`]).
    pub(crate) watched: Option<u64>,
    /// For a semaphore's slot queue: the semaphore's node, read right behind
    /// each create (its permit count), and never created here.
    semaphore: Option<String>,
    /// The semaphore node's data, read right behind the latest create.
    pub(crate) counted: Option<Vec<u8>>,
    armed: bool,
}

impl Entry {
    /// An entry for `request` (none: no label, the system clocks) in the
    /// queue under `parent`, on `session`.
    pub(crate) fn new(
        session: Arc<Session>,
        parent: String,
        acls: Arc<Acls>,
        cleanups: Cleanups,
        request: Option<&LockRequest>,
    ) -> Entry {
        Entry {
            session,
            parent,
            guid: Uuid::new_v4(),
            clock: request.map_or_else(|| Arc::new(SystemClock) as _, |r| r.clock().clone()),
            acls,
            cleanups,
            label: request.map(|r| r.label().clone()),
            access: request.and_then(|r| r.access()),
            node: None,
            strays: false,
            watched: None,
            semaphore: None,
            counted: None,
            armed: true,
        }
    }

    /// The entry of a slot queue of the semaphore node `semaphore`.
    pub(crate) fn in_semaphore(mut self, semaphore: String) -> Entry {
        self.semaphore = Some(semaphore);
        self
    }

    /// Creates our node and, with `listing`, reads the queue right behind
    /// it: two requests sent back to back, which the server answers in order,
    /// so the listing includes our node and costs no extra round trip. When
    /// the session vouched for the sequence number this create gets, it skips
    /// the listing: the node is first (see [`crate::locks::quiet`]). Without
    /// `listing`, the queue comes back only when it is known anyway (the
    /// vouched number, or the listing that found our node after a lost reply).
    ///
    /// Creates the lock's parent (a container node the server deletes once
    /// empty) when missing. When a create's reply is lost, finds the node by
    /// its owner uuid instead of leaving it orphaned.
    ///
    /// The node carries the fence floor's offset, confirmed in force at the
    /// create (see [`crate::fence::floor`]); when the floor was raised meanwhile,
    /// the node is created again. A session from before the floor (raised
    /// while it was disconnected) is retired instead, and this fails with a
    /// retryable error.
    pub(crate) async fn enqueue(&mut self, listing: bool) -> Result<Option<Queue>, LockError> {
        let session = self.session.clone();
        let parent = self.parent.clone();
        let reading = |e| map(format!("queueing under {parent}"), e);
        for _ in 0..ATTEMPTS {
            let Some(offset) = session.floor_offset().await? else {
                return Err(floor_raised(&self.parent));
            };
            let queue = self.create(listing, offset).await?;
            let client = session.client().map_err(reading)?;
            let confirmed = session.floor.confirm(&client, offset).await?;
            if !session.not_from_before_the_floor() {
                return Err(floor_raised(&self.parent));
            }
            if confirmed {
                return Ok(queue);
            }
            tracing::debug!(parent = %self.parent, "the fence floor was raised during a create; creating again");
            if let Some(node) = self.node.take() {
                delete_node(&client, &node.path)
                    .await
                    .map_err(|e| map(format!("deleting {}", node.path), e))?;
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            format!(
                "the fence floor kept changing while queueing under {}",
                self.parent
            ),
        ))
    }

    /// One create with the floor's `offset` (see [`enqueue`](Self::enqueue)).
    async fn create(&mut self, listing: bool, offset: u64) -> Result<Option<Queue>, LockError> {
        let data = NodeData::new(self.label.as_ref(), offset).encode();
        self.counted = None;
        let session = self.session.clone();
        let creating = |e| map(format!("creating a queue node under {}", self.parent), e);
        let client = session.client().map_err(creating)?;
        let (client, quiet) = (&client, &session.quiet);
        let prefix = format!("{}/{}", self.parent, node_prefix(self.guid, self.access));
        let acls = self.acls.clone();
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::new(&acls.nodes));
        // A reader-writer grant creates its node again (`crate::rw`), which
        // takes a sequence number: no sequence proof there.
        let proving = self.access.is_none();
        let mut claim = quiet.claim(&self.parent).filter(|_| proving);
        let mut last = None;
        for _ in 0..ATTEMPTS {
            // Requests go out in call order: a watch set here is in place
            // before the create is applied.
            let watched = claim
                .map(|c| c.watch())
                .or_else(|| quiet.watched(&self.parent))
                .filter(|_| proving);
            let watching = (proving && watched.is_none() && quiet.wants_watch(&self.parent))
                .then(|| client.check_and_watch_stat(&self.parent));
            let sent = self.clock.now();
            let create = client.create(&prefix, &data, &mode);
            let list = (listing && claim.is_none()).then(|| client.list_children(&self.parent));
            let counting = self.semaphore.as_ref().map(|p| client.get_data(p));
            let created = create.await;
            let watched = match watching {
                Some(exists) => quiet.watching(&self.parent, exists.await),
                None => watched,
            };
            match created {
                Ok((stat, sequence)) => {
                    let name = format!("{}{sequence}", node_prefix(self.guid, self.access));
                    let sequence = i32::try_from(sequence.into_i64()).ok().map(|s| s as u32);
                    let first = claim
                        .zip(sequence)
                        .is_some_and(|(c, s)| quiet.proves_first(&self.parent, c, s));
                    let alone = first.then(|| Queue::new(std::slice::from_ref(&name)));
                    self.node = Some(Node {
                        path: format!("{}/{name}", self.parent),
                        name,
                        czxid: stat.czxid,
                        sequence,
                        offset,
                        alive_since: sent,
                    });
                    self.watched = watched;
                    self.counted = match counting {
                        Some(counting) => counting.await.ok().map(|(data, _)| data),
                        None => None,
                    };
                    if alone.is_some() || !listing {
                        return Ok(alone);
                    }
                    return match list {
                        Some(list) => match list.await {
                            Ok(children) => Ok(Some(Queue::new(&children))),
                            Err(_) => self.relist(false).await.map(Some),
                        },
                        // The vouched number was taken: someone else queued.
                        None => self.relist(false).await.map(Some),
                    };
                }
                Err(zk::Error::NoNode) => {
                    drop((list, counting));
                    claim = None;
                    self.create_parent().await?;
                    last = Some(zk::Error::NoNode);
                }
                Err(e) if connection_lost(&e) => {
                    drop((list, counting));
                    claim = None;
                    tracing::debug!(parent = %self.parent, owner = %self.guid, error = %e, "a create's reply was lost; looking for our node");
                    self.strays = true;
                    last = Some(e);
                    if let Some(queue) = self.recover(offset).await? {
                        return Ok(Some(queue));
                    }
                }
                Err(e) => {
                    return Err(map(
                        format!("creating a queue node under {}", self.parent),
                        e,
                    ));
                }
            }
        }
        Err(map(
            format!("creating a queue node under {}", self.parent),
            last.unwrap_or(zk::Error::ConnectionLoss),
        ))
    }

    /// After a lost create reply: our node, if the create (with `offset`)
    /// happened.
    async fn recover(&mut self, offset: u64) -> Result<Option<Queue>, LockError> {
        // `sync` first: a create that reached the leader through the lost
        // connection is then visible here.
        let sent = self.clock.now();
        let queue = self.relist(true).await?;
        let Some(ours) = queue.first_of(self.guid).cloned() else {
            tracing::debug!(parent = %self.parent, owner = %self.guid, "no node of ours after a lost create reply; creating again");
            return Ok(None);
        };
        let path = format!("{}/{}", self.parent, ours.name);
        let reading = |e| map(format!("reading {path}"), e);
        let client = self.session.client().map_err(reading)?;
        let stat = retry(|| client.check_stat(&path))
            .await
            .map_err(|e| map(format!("reading {path}"), e))?;
        match stat {
            Some(stat) => {
                tracing::debug!(%path, "found our queue node after a lost create reply");
                self.node = Some(Node {
                    sequence: Some(ours.sequence),
                    name: ours.name,
                    path,
                    czxid: stat.czxid,
                    offset,
                    alive_since: sent,
                });
                Ok(Some(queue))
            }
            None => Ok(None),
        }
    }

    async fn create_parent(&self) -> Result<(), LockError> {
        let creating = |e| map(format!("creating the lock parent {}", self.parent), e);
        let client = &self.session.client().map_err(creating)?;
        let dir = zk::CreateMode::Container.with_acls(zk::Acls::new(&self.acls.dirs));
        match client.create(&self.parent, &[], &dir).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(zk::Error::NoNode) if self.semaphore.is_some() => Err(LockError::unavailable(
                BACKEND,
                format!("the semaphore of {} went away meanwhile", self.parent),
            )),
            Err(zk::Error::NoNode) => {
                // The root itself is gone (deleted by hand): recreate it.
                let root = &self.parent[..self.parent.rfind('/').unwrap_or(0)];
                let persistent =
                    zk::CreateMode::Persistent.with_acls(zk::Acls::new(&self.acls.dirs));
                client
                    .mkdir(root, &persistent)
                    .await
                    .map_err(|e| map(format!("creating the lock root {root}"), e))
            }
            Err(e) => Err(map(format!("creating the lock parent {}", self.parent), e)),
        }
    }

    /// The queue now; with `sync`, after the server caught up with the leader.
    pub(crate) async fn relist(&self, sync: bool) -> Result<Queue, LockError> {
        let listing = |e| map(format!("listing {}", self.parent), e);
        list(&self.session.client().map_err(listing)?, &self.parent, sync).await
    }

    /// After a lost create reply, a create sent through the old connection
    /// may still land after we looked, possibly ahead of the node we made
    /// instead: such a stray of ours ahead of our node would block us (and
    /// everyone behind us). Deletes it and reads the queue again.
    pub(crate) async fn prune(&self, queue: &Queue) -> Result<Option<Queue>, LockError> {
        let Some(ours) = self.name().and_then(|n| queue.position(n)) else {
            return Ok(None);
        };
        let ahead = |name: &str| queue.position(name).is_some_and(|at| at < ours);
        if !self.strays || !queue.all_of(self.guid).any(|n| ahead(&n.name)) {
            return Ok(None);
        }
        let deleting = |e| {
            map(
                format!("deleting a stray queue node under {}", self.parent),
                e,
            )
        };
        let client = self.session.client().map_err(deleting)?;
        for stray in queue.all_of(self.guid).filter(|n| ahead(&n.name)) {
            let path = format!("{}/{}", self.parent, stray.name);
            tracing::debug!(%path, "deleting a stray queue node of ours ahead of ours");
            delete_node(&client, &path)
                .await
                .map_err(|e| map(format!("deleting {path}"), e))?;
        }
        self.relist(false).await.map(Some)
    }

    /// Our node's name.
    pub(crate) fn name(&self) -> Option<&str> {
        self.node.as_ref().map(|n| n.name.as_str())
    }

    /// Our node's sequence number.
    pub(crate) fn sequence(&self) -> Option<u32> {
        let node = self.node.as_ref()?;
        node.sequence
            .or_else(|| QueueNode::parse(&node.name).map(|n| n.sequence))
    }

    /// Records a later request through the leader, sent at `at`, that
    /// showed our node alive (a `sync` a listing with it was read behind).
    pub(crate) fn seen_alive(&mut self, at: Moment) {
        if let Some(node) = self.node.as_mut()
            && at.mono() > node.alive_since.mono()
        {
            node.alive_since = at;
        }
    }

    /// Makes sure a lease from our node starts recently: when its latest
    /// proof is older than [`RECENT`](Self::RECENT) of the session timeout
    /// (a create answered late, a reply lost and the node found again after
    /// a reconnection), a `sync` and an `exists` prove it again. Else a
    /// grant could hand out a lease already near or past its deadline.
    /// Checks, too, that the session is not from before the fence floor
    /// (see [`Session::floor_offset`]): after a reconnection, no node is
    /// granted before the floor was read again. `false`: the node is gone
    /// (its session ended, or was retired for the floor).
    pub(crate) async fn prove_recent(&mut self) -> Result<bool, LockError> {
        if self.node.is_none() || !self.session.floor_holds().await? {
            return Ok(false);
        }
        let Some(node) = self.node.as_mut() else {
            return Ok(false);
        };
        if self.clock.now().since(node.alive_since) <= self.session.timeout / Self::RECENT {
            return Ok(true);
        }
        let syncing = |e| map(format!("syncing {}", node.path), e);
        let client = &self.session.client().map_err(syncing)?;
        let sent = self.clock.now();
        let synced = client.sync(&node.path);
        let exists = client.check_stat(&node.path);
        let outcome = match synced.await {
            Ok(()) | Err(zk::Error::NoNode) => exists.await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(Some(_)) => {
                node.alive_since = sent;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(map(format!("syncing {}", node.path), e)),
        }
    }

    /// A lease starts from a proof no older than this fraction of the
    /// session timeout (a quarter: the margin and drift take more).
    const RECENT: u32 = 4;

    /// Removes our node (and strays), waiting for the server. On failure
    /// the entry stays armed, so dropping it retries in the background.
    pub(crate) async fn remove(mut self) -> Result<(), LockError> {
        let outcome = remove(
            &self.session,
            &self.parent,
            self.guid,
            self.node.clone(),
            self.strays,
        )
        .await;
        match outcome {
            Ok(()) => {
                self.armed = false;
                Ok(())
            }
            Err(e) => Err(map(
                format!("removing a queue node under {}", self.parent),
                e,
            )),
        }
    }

    /// Hands over the node of a grant; the entry no longer removes it.
    pub(crate) fn granted(mut self) -> Option<Node> {
        self.armed = false;
        self.node.take()
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (session, parent, guid, node) = (
            self.session.clone(),
            std::mem::take(&mut self.parent),
            self.guid,
            self.node.take(),
        );
        // Requests go out in call order, so a create still in flight when
        // the future was dropped reaches the server before the sweep below.
        let strays = self.strays || node.is_none();
        tracing::debug!(%parent, owner = %guid, node = ?node.as_ref().map(|n| &n.name), strays, "a queue entry was dropped; removing its node in the background");
        let parent_shown = parent.clone();
        // Tried again until done while the session lives, like an expired
        // lease's node (see `until_cleaned`).
        let spawned = self.cleanups.spawn(async move {
            let what = format!("remove an abandoned queue node under {parent}");
            until_cleaned(&session, &what, || {
                remove(&session, &parent, guid, node.clone(), strays)
            })
            .await;
        });
        if !spawned {
            tracing::debug!(parent = %parent_shown, "queue entry dropped outside a runtime; its session removes the node");
        }
    }
}

async fn remove(
    session: &Session,
    parent: &str,
    guid: Uuid,
    node: Option<Node>,
    strays: bool,
) -> Result<(), zk::Error> {
    if session.is_ended() {
        // Its ephemerals go with it: on the servers' timer, or at once when
        // the client closes the session (`Session::shut`, `session::reap`).
        return Ok(());
    }
    let client = session.client()?;
    if let Some(node) = node {
        delete_node(&client, &node.path).await?;
    }
    if strays {
        sweep_owner(&client, parent, guid).await;
    }
    Ok(())
}

/// Several locks taken in one transaction (`try_acquire_each`).
mod multi;

#[cfg(test)]
mod tests;
