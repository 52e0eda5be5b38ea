//! Reader-writer locks: one queue of read and write nodes per name, laid
//! out as Apache Curator's `InterProcessReadWriteLock` lays it out, so that
//! Curator's readers and writers queue in the same nodes.
//!
//! The reader-writer lock `name` is the container node
//! `<root>/%rw/<segment>`, apart from the lock and the semaphore of that
//! name. A request creates an ephemeral sequential child
//! `_c_<owner uuid>-__READ__<sequence>` or `..-__WRIT__<sequence>` (in
//! protected mode, as a lock's node) and lists the queue in the same round
//! trip, as a lock does ([`Entry::enqueue`](crate::locks::queue::Entry::enqueue)).
//!
//! **The rules, decided by the queue.** A read is admitted while no node
//! but reads is ahead of its node; a write while its node is first
//! ([`Queue::admits`](crate::keys::names::Queue::admits)). Sequence numbers
//! only grow and the nodes ahead of a node only leave, so once admitted, a
//! node stays admitted for as long as it exists: nothing checks and then
//! sets.
//!
//! **Writer-preferring, for free.** A waiting writer's node *is* its
//! intent: every read asked after it queues behind it, and is not admitted
//! before it. The node leaves with the wait (granted, or given up: timed
//! out, failed, its future dropped, which removes it in the background
//! through the client's clean-ups as any queue node), and with the
//! writer's session when its process dies (within the session timeout,
//! the TTL of every lease). `try_acquire` removes its node at once when it
//! is not admitted: it leaves no intent.
//!
//! **Fences from the grant.** A node's `czxid` is the zxid of its create,
//! taken when it queued: a read that waited behind a write would get a
//! fence below that write's. So the grant takes its fence: one `multi`
//! writes the admitted node, deletes it and creates it again in place, an
//! ephemeral of the same session ([`Entry::take_fence`](crate::locks::queue::Entry::take_fence)),
//! and the new node's `czxid`, the transaction's zxid, is the fence, plus
//! the fence floor's offset in force at the transaction (as a lock's,
//! [`crate::fence::floor`]). zxids are the store's one counter: every grant
//! of the name, read or write, has a larger fence than every grant
//! before it, durable as a lock's, and above a raised floor. The node keeps
//! its name, so its place; the transaction fails whole if the node is
//! gone, so the grant stands on the node's existence and nothing else.
//! Its write comes first, so a waiter watching the node (an `exists`
//! watch) hears of a change and watches again, never of a deletion.
//!
//! From then on a share is a lock's grant in every way (the same `Held`):
//! renewed by its session's `sync` and the node's `czxid`, released by
//! deleting its path, kept by `set_remaining`, lost with its session or
//! when someone else deletes it. Waiting is the lock's line
//! ([`crate::wait`]), each waiter watching the node that keeps it waiting.

mod grant;

use lockcore::backend::wait::Wakeup;
use lockcore::{Access, Holder, LockError, LockName, OwnerToken};
use zookeeper_client as zk;

use crate::connection::Client;
use crate::connection::requests::list;
use crate::error::map;
use crate::keys::names::{NodeData, Queue};
use crate::keys::paths;

impl Client {
    /// The queue of the reader-writer lock `name`.
    pub(crate) fn rw_lock_path(&self, name: &LockName) -> String {
        paths::rw_lock(&self.config.root, name)
    }

    /// The holders of the reader-writer lock `name`, read after a `sync`:
    /// the nodes the queue admits (the reads ahead of every write, or the
    /// write first in line), each with its access, label and fence. A node
    /// admitted takes its fence at once (its grant's transaction), so a
    /// node listed between the two shows the fence of its create.
    pub(crate) async fn inspect_shares(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let live = self.live().await?;
        let parent = self.rw_lock_path(name);
        let reading = |e| map(format!("reading {parent}"), e);
        let client = &live.session.client().map_err(reading)?;
        let queue = list(client, &parent, true).await?;
        let admitted = queue.admitted();
        // Sent together: one round trip for every holder.
        let reads: Vec<_> = (admitted.iter())
            .map(|node| client.get_data(&format!("{parent}/{}", node.name)))
            .collect();
        let mut holders = Vec::with_capacity(admitted.len());
        for (node, read) in admitted.iter().zip(reads) {
            let (data, stat) = match read.await {
                Ok(read) => read,
                // Released since the listing.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map(format!("reading a holder of {parent}"), e)),
            };
            let data = NodeData::decode(&data);
            let owner = Some(OwnerToken::from_uuid(node.guid));
            // Another recipe's lock node excludes like a write.
            let access = node.access.unwrap_or(Access::Write);
            holders.push(
                Holder::new(data.fence(stat.czxid)?, owner, None)
                    .with_label(data.label)
                    .with_access(access),
            );
        }
        Ok(holders)
    }

    /// A wake-up once a node of the reader-writer lock `name` goes (a
    /// release, an expired session, a writer that gave up): a child watch
    /// on its queue, set by the listing that finds it (at once when the
    /// queue is empty). A node queued meanwhile wakes it too: one more look.
    pub(crate) async fn watch_shares(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let live = self.live().await?;
        let parent = self.rw_lock_path(name);
        let watching = |e| map(format!("watching {parent}"), e);
        let client = live.session.client().map_err(watching)?;
        let listed = client.list_and_watch_children(&parent).await;
        drop(client);
        match listed {
            Ok((children, watcher)) if Queue::new(&children).head().is_some() => {
                Ok(Some(Box::pin(async move {
                    watcher.changed().await;
                })))
            }
            Ok(_) | Err(zk::Error::NoNode) => Ok(Some(Box::pin(async {}))),
            Err(e) => Err(watching(e)),
        }
    }
}
