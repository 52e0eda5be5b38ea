//! Semaphores: `N` permits of one name, each permit a slot with a lock
//! queue of its own.
//!
//! The semaphore `name` is the node `<root>/%permits/<segment>` (a
//! container), whose data is its number of permits `N`, written when it is
//! created and never changed. Slot `k` (`0 <= k < N`) is the lock queue
//! `<semaphore>/<k>`: holding a permit is holding one slot's lock, so every
//! guarantee of a lock holds per slot (one holder, fences strictly
//! increasing, the same renewals, releases and session expiry), and at most
//! `N` slots exist, so at most `N` permits are held. A request takes a free
//! slot: one that nobody holds or waits for.
//!
//! **One agreed `N`.** The node read right behind a create (in the same
//! round trip) is the semaphore the new node lives under: a node pins its
//! slot queue, which pins the semaphore node, so it cannot have been replaced
//! in between. A count other than the one asked for voids the grant. While
//! permits are held, a request with another `N` is
//! [`LockError::PermitsMismatch`]; when none are, the semaphore node and its
//! empty slot queues are deleted (ZooKeeper refuses to delete a node with
//! children, so this fails if anyone queued meanwhile) and created again
//! with the new count.

use std::collections::BTreeSet;

use lockcore::backend::LockRequest;
use lockcore::backend::wait::Wakeup;
use lockcore::{Attempt, Holder, LockError, LockName, OwnerToken};
use zookeeper_client as zk;

use crate::connection::requests::{ATTEMPTS, delete_node, list};
use crate::connection::{Client, Live};
use crate::error::{BACKEND, map, vanished};
use crate::keys::names::{NodeData, Queue};
use crate::keys::paths;
use crate::locks::queue::Entry;

/// A semaphore as read: its count and its slots' queues.
struct Semaphore {
    /// `None`: no semaphore node (nobody holds or waits).
    count: Option<u32>,
    /// The queues of the slots that exist (a missing slot is free).
    slots: Vec<(u32, Queue)>,
}

impl Semaphore {
    fn held(&self) -> bool {
        self.slots.iter().any(|(_, q)| q.head().is_some())
    }
}

impl Client {
    /// The semaphore node of `name`.
    pub(crate) fn semaphore_path(&self, name: &LockName) -> String {
        paths::semaphore(&self.config.root, name)
    }

    /// One attempt at one of `permits` slots of `request.name()`; made once
    /// more on a new session if the session ended under it (as
    /// [`try_acquire`](Client::try_acquire)).
    pub(crate) async fn try_acquire_permit(
        &self,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        lockcore::backend::check_permits(request.name(), permits)?;
        let live = self.live().await?;
        match self.try_acquire_permit_on(&live, request, permits).await {
            Err(_) if live.session.is_ended() && !self.is_closed() => {
                let live = self.live().await?;
                self.try_acquire_permit_on(&live, request, permits).await
            }
            other => other,
        }
    }

    /// [`try_acquire_permit`](Self::try_acquire_permit) on the session of `live`.
    async fn try_acquire_permit_on(
        &self,
        live: &Live,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        let name = request.name();
        let path = self.semaphore_path(name);
        let reading = |e| map(format!("reading the semaphore {path}"), e);
        let client = live.session.client().map_err(reading)?;
        for _ in 0..ATTEMPTS {
            let semaphore = read(&client, &path).await?;
            match semaphore.count {
                None => {
                    self.create_semaphore(&client, &path, permits).await?;
                    continue;
                }
                Some(existing) if existing != permits => {
                    if semaphore.held() {
                        return Err(LockError::PermitsMismatch {
                            name: name.clone(),
                            requested: permits,
                            existing,
                        });
                    }
                    clear(&client, &path, &semaphore).await?;
                    continue;
                }
                Some(_) => {}
            }
            let taken: BTreeSet<u32> = (semaphore.slots.iter())
                .filter(|(_, q)| q.head().is_some())
                .map(|(k, _)| *k)
                .collect();
            let Some(slot) = free_slot(&taken, permits) else {
                return Ok(Attempt::Held { expires_in: None });
            };
            match self
                .take_slot(live, &client, request, &path, slot, permits)
                .await?
            {
                Taken::Granted(lease) => return Ok(Attempt::Acquired(lease)),
                // Taken by someone else meanwhile, or the semaphore changed.
                Taken::Busy | Taken::Changed => continue,
            }
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Queues in slot `slot` of the semaphore `path`; the grant if first.
    async fn take_slot(
        &self,
        live: &Live,
        client: &zk::Client,
        request: &LockRequest,
        path: &str,
        slot: u32,
        permits: u32,
    ) -> Result<Taken, LockError> {
        let session = &live.session;
        let parent = format!("{path}/{slot}");
        let mut entry = Entry::new(
            session.clone(),
            parent,
            self.acls.clone(),
            self.cleanups.clone(),
            Some(request),
        )
        .in_semaphore(path.to_owned());
        let mut queue = match entry.enqueue(true).await {
            Ok(queue) => queue.unwrap_or_default(),
            // The semaphore went away under the create: read it again.
            Err(e) if e.is_retryable() => return Ok(Taken::Changed),
            Err(e) => return Err(e),
        };
        if let Some(fresh) = entry.prune(&queue).await? {
            queue = fresh;
        }
        let counted = match entry.counted.take() {
            Some(data) => Some(data),
            // Not read with the create (a lost reply): read it now, under
            // the node that pins it.
            None => match client.get_data(path).await {
                Ok((data, _)) => Some(data),
                Err(zk::Error::NoNode) => None,
                Err(e) => return Err(map(format!("reading the semaphore {path}"), e)),
            },
        };
        let ours = entry.name().unwrap_or_default();
        let first = queue.position(ours) == Some(0);
        if counted.and_then(|d| count(&d)) != Some(permits) {
            remove(entry).await;
            return Ok(Taken::Changed);
        }
        if !first {
            remove(entry).await;
            return Ok(Taken::Busy);
        }
        let alone = queue.is_only(ours);
        if !entry.prove_recent().await? {
            return Err(vanished(request.name()));
        }
        let lease = self.grant_slot(live, request.name(), entry, alone, Some(slot))?;
        Ok(Taken::Granted(lease))
    }

    /// Creates the semaphore node with `permits` (and the node above it).
    async fn create_semaphore(
        &self,
        client: &zk::Client,
        path: &str,
        permits: u32,
    ) -> Result<(), LockError> {
        let dir = zk::CreateMode::Container.with_acls(zk::Acls::new(&self.acls.dirs));
        let data = permits.to_string();
        let creating = |e| map(format!("creating the semaphore {path}"), e);
        match client.create(path, data.as_bytes(), &dir).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(zk::Error::NoNode) => {
                let above = paths::semaphores(&self.config.root);
                let persistent =
                    zk::CreateMode::Persistent.with_acls(zk::Acls::new(&self.acls.dirs));
                client.mkdir(&above, &persistent).await.map_err(creating)
            }
            Err(e) => Err(creating(e)),
        }
    }

    /// The holders of the semaphore `name`, one per held slot.
    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let live = self.live().await?;
        let path = self.semaphore_path(name);
        let reading = |e| map(format!("reading the semaphore {path}"), e);
        let client = &live.session.client().map_err(reading)?;
        let semaphore = read(client, &path).await?;
        let heads: Vec<_> = (semaphore.slots.iter())
            .filter_map(|(k, q)| q.head().map(|head| (*k, head.clone())))
            .collect();
        let reads: Vec<_> = (heads.iter())
            .map(|(k, head)| client.get_data(&format!("{path}/{k}/{}", head.name)))
            .collect();
        let mut holders = Vec::with_capacity(heads.len());
        for ((slot, head), read) in heads.into_iter().zip(reads) {
            let (data, stat) = match read.await {
                Ok(read) => read,
                // Released since the listing.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map(format!("reading a holder of {path}"), e)),
            };
            let data = NodeData::decode(&data);
            let owner = Some(OwnerToken::from_uuid(head.guid));
            holders.push(
                Holder::new(data.fence(stat.czxid)?, owner, None)
                    .with_label(data.label)
                    .with_slot(slot),
            );
        }
        Ok(holders)
    }

    /// A wake-up once anything under the semaphore `name` is deleted (a
    /// permit released or expired, a waiter gone): a persistent recursive
    /// watch on its node, the only watch this client sets there.
    pub(crate) async fn watch_permits(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let live = self.live().await?;
        let path = self.semaphore_path(name);
        let client = (live.session.client())
            .map_err(|e| map(format!("watching the semaphore {path}"), e))?;
        let watching = client
            .watch(&path, zk::AddWatchMode::PersistentRecursive)
            .await;
        drop(client);
        let mut watcher = match watching {
            Ok(watcher) => watcher,
            Err(zk::Error::Unimplemented) => {
                return Err(LockError::store(
                    BACKEND,
                    "waiting for a permit needs ZooKeeper 3.6 or later (persistent watches)",
                ));
            }
            Err(e) => return Err(map(format!("watching the semaphore {path}"), e)),
        };
        Ok(Some(Box::pin(async move {
            // Events during a disconnection may be lost: wake once back.
            let mut disconnected = false;
            loop {
                let event = watcher.changed().await;
                match (event.event_type, event.session_state) {
                    (zk::EventType::NodeDeleted, _) => return,
                    (zk::EventType::Session, state) if state.is_terminated() => return,
                    (zk::EventType::Session, zk::SessionState::Disconnected) => disconnected = true,
                    (zk::EventType::Session, _) if disconnected => return,
                    _ => {}
                }
            }
        })))
    }
}

/// How a slot went.
enum Taken {
    Granted(lockcore::Lease),
    Busy,
    Changed,
}

/// A free slot below `permits` (none of `taken`), from a random start so
/// that concurrent requests spread over the free slots.
fn free_slot(taken: &BTreeSet<u32>, permits: u32) -> Option<u32> {
    if taken.len() >= permits as usize {
        return None;
    }
    let start = (uuid::Uuid::new_v4().as_u128() % u128::from(permits)) as u32;
    (start..permits)
        .chain(0..start)
        .find(|k| !taken.contains(k))
}

/// The semaphore node `path` (after a `sync`): its count and the queues of
/// its slots.
async fn read(client: &zk::Client, path: &str) -> Result<Semaphore, LockError> {
    let reading = |e| map(format!("reading the semaphore {path}"), e);
    let synced = client.sync(path);
    let counting = client.get_data(path);
    let listing = client.list_children(path);
    match synced.await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => return Err(reading(e)),
    }
    let (count, children) = match (counting.await, listing.await) {
        (Ok((data, _)), Ok(children)) => (count(&data), children),
        (Err(zk::Error::NoNode), _) | (_, Err(zk::Error::NoNode)) => {
            return Ok(Semaphore {
                count: None,
                slots: Vec::new(),
            });
        }
        (Err(e), _) | (_, Err(e)) => return Err(reading(e)),
    };
    let count = count.ok_or_else(|| {
        LockError::store(
            BACKEND,
            format!("the semaphore {path} holds no permit count"),
        )
    })?;
    let slots: Vec<u32> = (children.iter())
        .filter_map(|c| c.parse().ok())
        .filter(|k| *k < count)
        .collect();
    // Sent together: one round trip for every slot.
    let paths: Vec<String> = slots.iter().map(|k| format!("{path}/{k}")).collect();
    let listings: Vec<_> = paths.iter().map(|p| client.list_children(p)).collect();
    let mut read = Semaphore {
        count: Some(count),
        slots: Vec::with_capacity(slots.len()),
    };
    for ((k, listing), slot) in slots.into_iter().zip(listings).zip(&paths) {
        let queue = match listing.await {
            Ok(children) => Queue::new(&children),
            Err(zk::Error::NoNode) => Queue::default(),
            // A lost connection: this slot's queue, alone, once more.
            Err(_) => list(client, slot, false).await?,
        };
        read.slots.push((k, queue));
    }
    Ok(read)
}

/// A semaphore node's permit count.
fn count(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

/// Deletes the semaphore `path` and its slot queues, which must be empty
/// (nobody holds or waits): ZooKeeper refuses to delete a node with
/// children, so a request that queued meanwhile keeps them.
async fn clear(client: &zk::Client, path: &str, semaphore: &Semaphore) -> Result<(), LockError> {
    let clearing = |e| map(format!("clearing the semaphore {path}"), e);
    for (k, _) in &semaphore.slots {
        match delete_node(client, &format!("{path}/{k}")).await {
            Ok(_) | Err(zk::Error::NotEmpty) => {}
            Err(e) => return Err(clearing(e)),
        }
    }
    match delete_node(client, path).await {
        Ok(_) | Err(zk::Error::NotEmpty) => Ok(()),
        Err(e) => Err(clearing(e)),
    }
}

/// Removes a queue node that did not get its slot (in the background if
/// the server does not answer now).
async fn remove(entry: Entry) {
    if let Err(e) = entry.remove().await {
        tracing::debug!(error = %e, "could not remove a permit's queue node now; retrying in the background");
    }
}
