//! Setting a held lease's remaining time (`set_remaining`): what a job's
//! `at_least` and `release_no_sooner_than` stand on. The grant's node, an
//! ephemeral of its session, becomes a TTL node at the same path: it keeps
//! its place at the head of the queue, outlives the session, and the
//! servers delete it once its time has run out.
//!
//! **One transaction.** A `multi` writes the node's data, deletes it and
//! creates it again as a persistent node with a TTL of the remaining time.
//! The write and the delete fail if
//! the node is gone (released, evicted, its session ended, its TTL ran
//! out), and then nothing is created: the path names one grant (its owner's
//! uuid and sequence number) and nothing else ever creates it, so its
//! existence is the owner and fence check, as for a release, and a lease
//! is never created again.
//!
//! **The same fence.** The new node's `czxid` is the transaction's, so its
//! data carries the grant's fence ([`NodeData::kept`]), which every reader
//! of fences (`inspect`, `evict`, a semaphore's holders) takes instead;
//! waiters read none. The next grant's `czxid` is above the transaction's,
//! which is above the grant's, and its offset no smaller: fences still only
//! grow.
//!
//! **Waiters.** A waiter watching the node (an `exists` watch, one-shot)
//! is told of the transaction's first change, the write
//! (`NodeDataChanged`), never of its delete: it watches again and finds the
//! kept node. So a deletion event always means the node is gone, and a
//! hand-off costs no look to tell the two apart. The deletion by the
//! servers wakes it for good.
//!
//! **Expiry.** The leader deletes a TTL node that has no children at its
//! first sweep after the node's `mtime` (the transaction's time) is more
//! than the TTL old, on the leader's wall clock; it sweeps every
//! `znode.container.checkIntervalMs` (60 s by default), which
//! [`container_check_interval`](crate::ZooKeeperConfig::container_check_interval)
//! tells this client and the capabilities declare as slack. Never early,
//! unless that wall clock steps forward. A sweep deletes what it found
//! expired without looking again, so a kept node must never be kept again
//! once its time has run out: that is refused past the lease's local
//! deadline, which comes before the servers' expiry.
//!
//! **Servers without TTL nodes** (`zookeeper.extendedTypesEnabled` not set)
//! refuse the create, and with it the transaction: connect probes for
//! that ([`crate::connection::probe::keeps_ttl_nodes`]), and the answer is
//! [`LockError::Unsupported`] with a log line naming the setting.

use std::time::Duration;

use lockcore::backend::Ttl;
use lockcore::{Lease, LockError, LockName, ReleaseOutcome};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::connection::Client;
use crate::connection::probe::NO_TTL_NODES;
use crate::connection::requests::{RECREATE, Recreated, delete_node, recreate};
use crate::error::{BACKEND, map, not_held};
use crate::keys::names::NodeData;
use crate::locks::held::{Held, Over, gone};

impl Client {
    /// Keeps `lease`'s node for exactly `remaining` from when the servers
    /// apply the transaction, as a TTL node (see the module docs). Again on
    /// a kept lease: its TTL node is replaced by another (from the live
    /// session: the grant's may have ended).
    pub(crate) async fn set_remaining(
        &self,
        lease: &Lease,
        remaining: Ttl,
    ) -> Result<Lease, LockError> {
        self.refuse_closed()?;
        if !self.keeps_ttl_nodes() {
            return Err(self.no_ttl_nodes(lease.name()));
        }
        let Some(held) = self.held(lease) else {
            return Err(not_held(lease));
        };
        let sent = lease.now();
        let now = Instant::now();
        let (client, before) = match held.kept() {
            // Past its deadline it may be swept already: never kept again.
            Some(_) if now >= held.deadline() => return Err(not_held(lease)),
            Some(czxid) => {
                let live = self.live().await?;
                let client = (live.session.client()).map_err(|e| keeping(held, e))?;
                (client, czxid)
            }
            None => {
                if held.expire_if_due(now) {
                    self.delete_expired_later(held);
                    return Err(not_held(lease));
                }
                if held.over() != Over::No {
                    return Err(not_held(lease));
                }
                // A session retired for a raised fence floor loses its grants.
                if held.session.is_ended() || !held.session.floor_holds().await? {
                    gone(held);
                    return Err(not_held(lease));
                }
                let client = (held.session.client()).map_err(|e| keeping(held, e))?;
                (client, held.czxid)
            }
        };
        let keeping = Keeping::start(held);
        let kept = self.keep(&client, held, before, remaining).await;
        match kept {
            Ok(Recreated::As(czxid)) => {
                // Judged on the TTL now, not on the session's timing.
                let kept = (lease.clone().with_ttl(remaining))
                    .with_extra_margin(Duration::ZERO)
                    .renewed(sent);
                // Kept before no longer keeping: a deletion event handled
                // in between is no loss.
                held.keep(czxid, kept.deadline());
                tracing::debug!(name = %lease.name(), fence = %lease.fence(), remaining = ?remaining.get(), "lock node kept as a TTL node");
                Ok(kept)
            }
            Ok(Recreated::Gone) => {
                drop(keeping);
                held.unkeep(Over::Gone);
                gone(held);
                Err(not_held(lease))
            }
            Err(e) => {
                drop(keeping);
                // Its deadline may have passed meanwhile, unwatched.
                if held.expire_if_due(Instant::now()) {
                    self.delete_expired_later(held);
                }
                Err(e)
            }
        }
    }

    /// Sends the keep transaction ([`recreate`]: a write, a delete and a
    /// create of the node as a TTL node) until its outcome is known: after
    /// a lost reply, a `czxid` other than `before` (the node's until now)
    /// means it went through.
    async fn keep(
        &self,
        client: &zk::Client,
        held: &Held,
        before: i64,
        remaining: Ttl,
    ) -> Result<Recreated, LockError> {
        let data = NodeData::kept(held.label.as_ref(), held.fence).encode();
        let mode = zk::CreateMode::Persistent
            .with_acls(zk::Acls::new(&self.acls.nodes))
            .with_ttl(server_ttl(remaining));
        match recreate(client, &held.path, &data, &mode, before).await {
            Ok(kept) => Ok(kept),
            Err(zk::MultiWriteError::OperationFailed {
                index: RECREATE,
                source: zk::Error::Unimplemented | zk::Error::BadArguments(_),
            }) => {
                self.refuses_ttl_nodes();
                Err(self.no_ttl_nodes(&held.name))
            }
            Err(e) => Err(keeping(held, e.into())),
        }
    }

    /// Releases a kept grant: deletes its TTL node, from the live session
    /// (the grant's may have ended). Past the lease's deadline it is
    /// deleted all the same (as an expired grant's node is), but not
    /// reported released.
    pub(crate) async fn release_kept(&self, held: &Held) -> Result<ReleaseOutcome, LockError> {
        let releasing = |e| map(format!("releasing {}", held.path), e);
        let live = self.live().await?;
        let expired = Instant::now() >= held.deadline();
        let client = live.session.client().map_err(releasing)?;
        let deleted = delete_node(&client, &held.path).await.map_err(releasing)?;
        held.unkeep(Over::Released);
        if let Some(sequence) = held.sequence {
            live.session.lines.deleted(&held.parent, sequence);
        }
        Ok(match deleted && !expired {
            true => ReleaseOutcome::Released,
            false => ReleaseOutcome::NotHeld,
        })
    }

    /// `Unsupported`, said in a log line naming the missing server setting.
    fn no_ttl_nodes(&self, name: &LockName) -> LockError {
        tracing::warn!(%name, root = %self.config.root, "{NO_TTL_NODES}");
        LockError::Unsupported {
            backend: BACKEND,
            operation: "set_remaining",
        }
    }
}

/// Marks a grant as being kept while it lives ([`Held::keeping`]), also
/// when the call is dropped half-way (bounded out, cancelled).
struct Keeping<'a>(&'a Held);

impl<'a> Keeping<'a> {
    fn start(held: &'a Held) -> Self {
        held.keeping(true);
        Keeping(held)
    }
}

impl Drop for Keeping<'_> {
    fn drop(&mut self) {
        self.0.keeping(false);
    }
}

/// The TTL the servers are given for `remaining`: whole milliseconds,
/// rounded up, and one more, since they compare whole milliseconds of
/// their wall clock (never early by a fraction of one).
fn server_ttl(remaining: Ttl) -> Duration {
    Duration::from_millis(remaining.as_millis_ceil().saturating_add(1))
}

/// An error while keeping `held`'s node.
fn keeping(held: &Held, e: zk::Error) -> LockError {
    map(format!("keeping {} as a TTL node", held.path), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_ttl_is_never_short() {
        let caps =
            lockcore::Capabilities::new(BACKEND).ttl_range(Duration::from_nanos(1), Duration::MAX);
        let ttl = |d: Duration| server_ttl(caps.effective_remaining(d).unwrap());
        assert_eq!(ttl(Duration::from_secs(4)), Duration::from_millis(4001));
        assert_eq!(ttl(Duration::from_micros(1500)), Duration::from_millis(3));
        assert_eq!(ttl(Duration::from_nanos(1)), Duration::from_millis(2));
    }
}
