//! An atomic multi-lock attempt (`LockBackend::try_acquire_each`): one
//! `multi` that queues a node in every name's queue, granted, or writes
//! nothing.
//!
//! `try_acquire` grants a lock when its node is first: when the queue was
//! empty as the node was created (a waiter is a node, so it never barges
//! past one). A `multi` cannot compare a parent's children (`check` looks
//! at its data version only), but it can delete the parent: ZooKeeper
//! refuses to delete a node with children (`NotEmpty`), and fails the whole
//! transaction with it. So, after a read of every parent (one round trip),
//! the attempt is one `multi` that, for each name:
//!
//! 1. deletes the parent (a container node, empty when read), or nothing
//!    when the read found it missing;
//! 2. creates the parent again, a container with the lock parents' ACL;
//! 3. creates the name's node in it, the node `try_acquire` creates
//!    (ephemeral sequential, protected-mode name, the label and the fence
//!    floor's offset as its data).
//!
//! Applied, every queue held nothing but our node: each is first, granted
//! as `try_acquire` grants it (the same lease, renewal, release, loss and
//! eviction notice). Refused, nothing was written: a parent not empty
//! (someone queued since the read) is a name held; a parent that came or
//! went (the server's container sweep, another client) is read again. A
//! queue node found by the read is a name held (its holder, or a waiter
//! ahead of us, which `try_acquire` would not pass either).
//!
//! **Fences.** Every node of one `multi` has its transaction's zxid as its
//! `czxid`: larger than every zxid before it, so each name's fence (plus the
//! floor's offset, confirmed in force as a create confirms it) is above
//! every earlier grant of that name, whatever its queue did since.
//!
//! **The parent created again.** An empty parent is deleted and created in
//! the same transaction: nobody sees it missing, and a create racing it
//! lands before (the `multi` fails) or after (behind our node). Its
//! sequence numbers restart at 0, as after the server's container sweep: a
//! session's sequence proof ([`crate::locks::quiet`]) stands on a data
//! watch on the parent, which the deletion fires, so it proves nothing
//! across it. A parent holding other children than queue nodes cannot be
//! deleted: the attempt is `Unsupported` there, and the locker takes the
//! names one by one.
//!
//! **Lost replies and cancels.** After a lost reply, every parent is read
//! again behind a `sync` and our nodes are looked for by their owner uuids,
//! as after a lost create: all found, the attempt is granted; none, it was
//! not applied (it never applies later over our nodes: its deletes or
//! parent creates would fail). A dropped attempt sweeps each parent for its
//! uuid in the background, as a dropped queue entry does.

use futures_util::future::join_all;
use lockcore::backend::{LockRequest, Moment, check_each};
use lockcore::{AttemptEach, Lease, LockError};
use zookeeper_client as zk;

use super::{Entry, Node};
use crate::connection::requests::{ATTEMPTS, delete_node, retry};
use crate::connection::{Client, Live};
use crate::error::{BACKEND, connection_lost, map, vanished};
use crate::fence::floor::floor_raised;
use crate::keys::names::{NodeData, Queue, QueueNode, node_prefix};

/// The most names one attempt takes: three operations each keep a `multi`
/// of the longest names (255 bytes, escaped) well within ZooKeeper's 1 MB
/// request limit. More are `Unsupported`: the locker takes them one by one.
pub(crate) const MAX_NAMES: usize = 128;

/// What the read found under one name's parent.
enum Found {
    /// No parent (never created, or swept by the server).
    Missing,
    /// A parent without children.
    Empty,
    /// A queue node: the name is held, or waited for.
    Queued,
    /// Children, none a queue node: the parent cannot be deleted.
    Other,
}

/// What one `multi` did.
enum Sent {
    /// Applied: every entry has its node.
    Applied,
    /// Refused: someone queued under this name since the read.
    Held(usize),
    /// Refused: this name's parent came or went since the read.
    Changed(usize),
    /// Refused: the lock root itself is gone.
    NoRoot(usize),
}

/// An operation of the `multi`, with the entry it is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    DeleteParent,
    CreateParent,
    CreateNode,
}

impl Client {
    /// Every lock of `requests` (distinct names), each granted as
    /// [`try_acquire`](Self::try_acquire) grants it, or none and a name
    /// found held. Made once more on a new session if the session ended
    /// under it.
    pub(crate) async fn try_acquire_each(
        &self,
        requests: &[LockRequest],
    ) -> Result<AttemptEach, LockError> {
        // Two nodes of one name in one `multi` would both be created in a
        // parent read empty.
        check_each(requests)?;
        if requests.len() > MAX_NAMES {
            return Err(unsupported());
        }
        let live = self.live().await?;
        match self.try_acquire_each_on(&live, requests).await {
            Err(_) if live.session.is_ended() && !self.is_closed() => {
                let live = self.live().await?;
                self.try_acquire_each_on(&live, requests).await
            }
            other => other,
        }
    }

    /// [`try_acquire_each`](Self::try_acquire_each) on the session of `live`.
    async fn try_acquire_each_on(
        &self,
        live: &Live,
        requests: &[LockRequest],
    ) -> Result<AttemptEach, LockError> {
        let session = &live.session;
        let mut entries: Vec<Entry> = (requests.iter())
            .map(|r| {
                let parent = self.lock_path(r.name());
                let (acls, cleanups) = (self.acls.clone(), self.cleanups.clone());
                Entry::new(session.clone(), parent, acls, cleanups, Some(r))
            })
            .collect();
        let client = (session.client()).map_err(|e| map("taking a multi-lock", e))?;
        // The name whose queue changed last; `None`: the fence floor did.
        let mut changed = None;
        for _ in 0..ATTEMPTS {
            let Some(offset) = session.floor_offset().await? else {
                return Err(floor_raised(&entries[0].parent));
            };
            let mut missing = Vec::with_capacity(entries.len());
            for (i, found) in read(&client, &entries).await?.into_iter().enumerate() {
                match found {
                    Found::Queued => return Ok(held(requests, entries, i)),
                    Found::Other => {
                        tracing::debug!(parent = %entries[i].parent, "a lock parent with other children than queue nodes: no atomic multi-lock");
                        let_go(entries);
                        return Err(unsupported());
                    }
                    Found::Missing => missing.push(true),
                    Found::Empty => missing.push(false),
                }
            }
            match send(&client, &mut entries, &missing, offset).await? {
                Sent::Applied => {}
                Sent::Held(i) => return Ok(held(requests, entries, i)),
                Sent::Changed(i) => {
                    changed = Some(i);
                    continue;
                }
                Sent::NoRoot(i) => {
                    entries[i].create_parent().await?;
                    changed = Some(i);
                    continue;
                }
            }
            let confirmed = session.floor.confirm(&client, offset).await?;
            if !session.not_from_before_the_floor() {
                return Err(floor_raised(&entries[0].parent));
            }
            if confirmed {
                return self.grant_each(live, requests, entries).await;
            }
            tracing::debug!("the fence floor was raised during a multi-lock; taking it again");
            undo(&client, &mut entries).await?;
            changed = None;
        }
        match changed {
            Some(i) => Ok(held(requests, entries, i)),
            None => Err(LockError::unavailable(
                BACKEND,
                "the fence floor kept changing while taking a multi-lock",
            )),
        }
    }

    /// Turns every entry's node, just created, into a lease.
    async fn grant_each(
        &self,
        live: &Live,
        requests: &[LockRequest],
        mut entries: Vec<Entry>,
    ) -> Result<AttemptEach, LockError> {
        // Everything that may fail, before the first grant: a grant is then
        // never left behind by a failure of the next one.
        self.capabilities().effective_ttl(live.session.timeout)?;
        for (entry, request) in entries.iter_mut().zip(requests) {
            if !entry.ready().await? {
                return Err(vanished(request.name()));
            }
            if let Some(node) = &entry.node {
                node.fence()?;
            }
        }
        let leases = (entries.into_iter().zip(requests))
            .map(|(entry, request)| self.grant(live, request.name(), entry, true))
            .collect::<Result<Vec<Lease>, LockError>>()?;
        Ok(AttemptEach::Acquired(leases))
    }
}

fn unsupported() -> LockError {
    LockError::Unsupported {
        backend: BACKEND,
        operation: "try_acquire_each",
    }
}

/// `Held` naming request `i`'s name (see [`let_go`]).
fn held(requests: &[LockRequest], entries: Vec<Entry>, i: usize) -> AttemptEach {
    let_go(entries);
    AttemptEach::Held {
        name: requests[i].name().clone(),
        expires_in: None,
    }
}

/// Drops entries that created nothing, without sweeping their parents
/// (those whose reply was lost still do).
fn let_go(entries: Vec<Entry>) {
    for mut entry in entries {
        if entry.node.is_none() && !entry.strays {
            entry.armed = false;
        }
    }
}

/// Every parent's children, read together (one round trip).
async fn read(client: &zk::Client, entries: &[Entry]) -> Result<Vec<Found>, LockError> {
    let reads = entries
        .iter()
        .map(|e| retry(|| client.list_children(&e.parent)));
    let mut found = Vec::with_capacity(entries.len());
    for (read, entry) in join_all(reads).await.into_iter().zip(entries) {
        found.push(match read {
            Ok(children) if children.is_empty() => Found::Empty,
            Ok(children) if Queue::new(&children).head().is_some() => Found::Queued,
            Ok(_) => Found::Other,
            Err(zk::Error::NoNode) => Found::Missing,
            Err(e) => return Err(map(format!("listing {}", entry.parent), e)),
        });
    }
    Ok(found)
}

/// The `multi` over every entry (see the module docs); `missing`: the
/// parents the read found missing.
async fn send(
    client: &zk::Client,
    entries: &mut [Entry],
    missing: &[bool],
    offset: u64,
) -> Result<Sent, LockError> {
    let acls = entries[0].acls.clone();
    let dir = zk::CreateMode::Container.with_acls(zk::Acls::new(&acls.dirs));
    let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::new(&acls.nodes));
    let building = |e| map("building a multi-lock's transaction", e);
    let nodes: Vec<(String, Vec<u8>)> = (entries.iter())
        .map(|e| {
            let prefix = format!("{}/{}", e.parent, node_prefix(e.guid, None));
            (prefix, NodeData::new(e.label.as_ref(), offset).encode())
        })
        .collect();
    let mut multi = client.new_multi_writer();
    let mut steps = Vec::with_capacity(entries.len() * 3);
    for (i, (entry, (prefix, data))) in entries.iter().zip(&nodes).enumerate() {
        if !missing[i] {
            multi.add_delete(&entry.parent, None).map_err(building)?;
            steps.push((i, Step::DeleteParent));
        }
        multi
            .add_create(&entry.parent, &[], &dir)
            .map_err(building)?;
        steps.push((i, Step::CreateParent));
        multi.add_create(prefix, data, &mode).map_err(building)?;
        steps.push((i, Step::CreateNode));
    }
    let sent: Vec<Moment> = entries.iter().map(|e| e.clock.now()).collect();
    let results = match multi.commit().await {
        Ok(results) => results,
        Err(zk::MultiWriteError::OperationFailed { index, source }) => {
            let Some(&(i, step)) = steps.get(index) else {
                return Err(LockError::store(
                    BACKEND,
                    format!(
                        "a multi-lock's transaction failed at operation {index} of {}",
                        steps.len()
                    ),
                ));
            };
            return match (step, source) {
                (Step::DeleteParent, zk::Error::NotEmpty) => Ok(Sent::Held(i)),
                (Step::DeleteParent, zk::Error::NoNode)
                | (Step::CreateParent, zk::Error::NodeExists) => Ok(Sent::Changed(i)),
                (Step::CreateParent, zk::Error::NoNode) => Ok(Sent::NoRoot(i)),
                (_, e) => Err(map(
                    format!("taking {} in a multi-lock", entries[i].parent),
                    e,
                )),
            };
        }
        Err(zk::MultiWriteError::RequestFailed { source }) if connection_lost(&source) => {
            return recover(client, entries, offset).await;
        }
        Err(zk::MultiWriteError::RequestFailed { source }) => {
            return Err(map("taking a multi-lock", source));
        }
    };
    record(client, entries, &steps, &results, offset, &sent).await
}

/// Gives each entry the node the applied `multi` created for it. Every
/// node of one transaction has its zxid as `czxid`, which the reply's
/// container creates carry (some servers answer a `multi`'s other creates
/// without their stat: ZOOKEEPER-4026); else it is read.
async fn record(
    client: &zk::Client,
    entries: &mut [Entry],
    steps: &[(usize, Step)],
    results: &[zk::MultiWriteResult],
    offset: u64,
    sent: &[Moment],
) -> Result<Sent, LockError> {
    let mut czxid = results.iter().find_map(|r| match r {
        zk::MultiWriteResult::Create { stat, .. } if !stat.is_invalid() => Some(stat.czxid),
        _ => None,
    });
    let created = (steps.iter().zip(results)).filter(|((_, step), _)| *step == Step::CreateNode);
    for (&(i, _), result) in created {
        let zk::MultiWriteResult::Create { path, .. } = result else {
            return Err(LockError::store(
                BACKEND,
                "a multi-lock's transaction answered a create with something else",
            ));
        };
        let entry = &mut entries[i];
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        let path = format!("{}/{name}", entry.parent);
        if czxid.is_none() {
            let reading = |e| map(format!("reading {path}"), e);
            let stat = retry(|| client.check_stat(&path)).await.map_err(reading)?;
            // Gone at once: its session ended.
            czxid = Some(
                stat.ok_or_else(|| {
                    LockError::unavailable(BACKEND, format!("{path} went away before the grant"))
                })?
                .czxid,
            );
        }
        entry.node = Some(Node {
            sequence: QueueNode::sequence_of(&name),
            name,
            path,
            czxid: czxid.unwrap_or_default(),
            offset,
            alive_since: sent[i],
        });
    }
    Ok(Sent::Applied)
}

/// After a lost reply: our nodes, if the `multi` was applied (all of them:
/// the transaction is atomic; fewer, and someone deleted some since, so
/// the rest is deleted and the attempt made again).
async fn recover(
    client: &zk::Client,
    entries: &mut [Entry],
    offset: u64,
) -> Result<Sent, LockError> {
    let mut found = 0;
    for entry in entries.iter_mut() {
        entry.strays = true;
        if entry.recover(offset).await?.is_some() {
            found += 1;
        }
    }
    if found == entries.len() {
        tracing::debug!("found a multi-lock's nodes after a lost reply");
        return Ok(Sent::Applied);
    }
    undo(client, entries).await?;
    Ok(Sent::Changed(0))
}

/// Deletes the entries' nodes (they stay armed, to sweep for strays).
async fn undo(client: &zk::Client, entries: &mut [Entry]) -> Result<(), LockError> {
    for entry in entries.iter_mut() {
        if let Some(path) = entry.node.as_ref().map(|n| n.path.clone()) {
            delete_node(client, &path)
                .await
                .map_err(|e| map(format!("deleting {path}"), e))?;
            entry.node = None;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
