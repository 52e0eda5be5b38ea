//! Turning an admitted queue node into a grant: a lock's node as it is
//! (proven recent), a reader-writer lock's created again in place, the new
//! node's `czxid` its grant's fence.

use lockcore::LockError;
use zookeeper_client as zk;

use crate::connection::requests::{ATTEMPTS, Recreated, recreate};
use crate::error::{BACKEND, map};
use crate::fence::floor::floor_raised;
use crate::keys::names::NodeData;
use crate::locks::queue::Entry;

impl Entry {
    /// Makes our node, admitted, ready to become a lease: a lock's node
    /// proven recent ([`prove_recent`](Self::prove_recent)), a reader-writer
    /// lock's given its grant's fence ([`take_fence`](Self::take_fence)).
    /// `false`: the node is gone.
    pub(crate) async fn ready(&mut self) -> Result<bool, LockError> {
        match self.access {
            None => self.prove_recent().await,
            Some(_) => self.take_fence().await,
        }
    }

    /// Takes the fence of our node's grant, once the queue admits it: one
    /// `multi` creates the node again in place ([`recreate`]: a write, a
    /// delete and a create, an ephemeral of the same session), with the
    /// fence floor's offset in force now. The new node's `czxid` is the
    /// transaction's zxid, above every fence of the name handed out before
    /// (see [`crate::rw`]); the transaction fails whole if the node is gone
    /// (`false`), so the grant is decided on the node's existence, and
    /// nothing else. It is a write through the leader: the lease starts at
    /// its send time.
    ///
    /// As for a create ([`Entry::enqueue`]), the offset must be the one in
    /// force when the transaction was applied: when the floor was raised
    /// meanwhile, the node is created again with the new one. A session
    /// from before the floor is retired, and this fails with a retryable
    /// error.
    pub(crate) async fn take_fence(&mut self) -> Result<bool, LockError> {
        let session = self.session.clone();
        let Some(path) = self.node.as_ref().map(|n| n.path.clone()) else {
            return Ok(false);
        };
        let granting = |e| map(format!("granting {path}"), e);
        let client = session.client().map_err(granting)?;
        let mode = zk::CreateMode::Ephemeral.with_acls(zk::Acls::new(&self.acls.nodes));
        for _ in 0..ATTEMPTS {
            let Some(offset) = session.floor_offset().await? else {
                return Err(floor_raised(&self.parent));
            };
            let Some(node) = self.node.as_mut() else {
                return Ok(false);
            };
            let data = NodeData::new(self.label.as_ref(), offset).encode();
            let sent = self.clock.now();
            let written = recreate(&client, &path, &data, &mode, node.czxid).await;
            match written.map_err(|e| granting(e.into()))? {
                Recreated::Gone => return Ok(false),
                Recreated::As(czxid) => {
                    (node.czxid, node.offset, node.alive_since) = (czxid, offset, sent);
                }
            }
            let confirmed = session.floor.confirm(&client, offset).await?;
            if !session.not_from_before_the_floor() {
                return Err(floor_raised(&self.parent));
            }
            if confirmed {
                return Ok(true);
            }
            tracing::debug!(%path, "the fence floor was raised during a grant; granting again");
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("the fence floor kept changing while granting {path}"),
        ))
    }
}

#[cfg(test)]
mod tests;
