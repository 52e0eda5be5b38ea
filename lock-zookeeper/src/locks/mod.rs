//! Locks: taking one (enqueue, and keep the node only if it is first),
//! granting it as a lease, renewing and releasing it, keeping it past its
//! session (`set_remaining`), and looking at it from outside (inspect,
//! evict, watch). The queue node itself, the grant's node watch, the
//! sequence proof and several locks taken in one transaction (`queue::multi`)
//! live in the files of this folder. A reader-writer lock's share is taken,
//! granted, renewed and released the same way ([`crate::rw`] says what
//! differs).

pub(crate) mod eviction_notice;
pub(crate) mod held;
mod holders;
pub(crate) mod queue;
pub(crate) mod quiet;
pub(crate) mod remaining;
mod renew;

use std::sync::Arc;

use lockcore::backend::LockRequest;
use lockcore::{Attempt, Lease, LockError, LockName, OwnerToken, ReleaseOutcome};
use tokio::time::Instant;

use crate::connection::{Client, Live};
use crate::error::{BACKEND, map, vanished};
use held::{Held, Over, gone};
use queue::Entry;

impl Client {
    /// The lease's node, if `lease` is a grant of this backend kind that
    /// matches its own fields (a forged lease has none).
    pub(crate) fn held<'l>(&self, lease: &'l Lease) -> Option<&'l Arc<Held>> {
        lease.extension::<Arc<Held>>().filter(|h| {
            h.name == *lease.name()
                && h.guid == lease.owner().as_uuid()
                && h.fence == lease.fence()
                && h.access == lease.access()
        })
    }

    /// The queue `request` waits in: the lock's, or the reader-writer
    /// lock's ([`crate::rw`]).
    pub(crate) fn queue_path(&self, request: &LockRequest) -> String {
        match request.access() {
            None => self.lock_path(request.name()),
            Some(_) => self.rw_lock_path(request.name()),
        }
    }

    /// One attempt: enqueue, and keep the node only if the queue admits it
    /// (a lock's, or a reader-writer lock's read or write: [`crate::rw`]).
    /// Made once more on a new session if the session ended under it
    /// (retired for a raised fence floor, or expired).
    pub(crate) async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let live = self.live().await?;
        match self.try_acquire_on(&live, request).await {
            Err(_) if live.session.is_ended() && !self.is_closed() => {
                let live = self.live().await?;
                self.try_acquire_on(&live, request).await
            }
            other => other,
        }
    }

    /// [`try_acquire`](Self::try_acquire) on the session of `live`.
    async fn try_acquire_on(
        &self,
        live: &Live,
        request: &LockRequest,
    ) -> Result<Attempt, LockError> {
        let name = request.name();
        let mut entry = Entry::new(
            live.session.clone(),
            self.queue_path(request),
            self.acls.clone(),
            self.cleanups.clone(),
            Some(request),
        );
        let Some(mut queue) = entry.enqueue(true).await? else {
            return Err(LockError::store(
                BACKEND,
                "a listed enqueue returned no queue",
            ));
        };
        if let Some(fresh) = entry.prune(&queue).await? {
            queue = fresh;
        }
        let ours = entry.name().unwrap_or_default();
        if queue.admits(ours, entry.access) {
            let alone = queue.is_only(ours);
            if !entry.ready().await? {
                return Err(vanished(name));
            }
            return Ok(Attempt::Acquired(self.grant(live, name, entry, alone)?));
        }
        if let Err(e) = entry.remove().await {
            tracing::debug!(%name, error = %e, "could not remove a queue node now; retrying in the background");
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Turns the head of the queue into a lease, starting at the node's
    /// `alive_since`: the send time of a request that went through the leader
    /// (a write or a `sync`), so the leader keeps the session (and the node)
    /// until `alive_since + timeout`, less the session's margin (see
    /// [`Timing::new`]). The lease is judged on the clock that time was read
    /// on, the request's. A read answered by a follower proves nothing of the
    /// kind: a follower cut off from the leader keeps answering for a while.
    /// Callers make that start recent first ([`Entry::ready`]).
    /// `alone`: the latest look at the queue showed only our node, so nobody
    /// else is waiting and the next create here is likely ours again (the
    /// release then vouches for its number; see [`crate::locks::quiet`]).
    pub(crate) fn grant(
        &self,
        live: &Live,
        name: &LockName,
        entry: Entry,
        alone: bool,
    ) -> Result<Lease, LockError> {
        self.grant_slot(live, name, entry, alone, None)
    }

    /// [`grant`](Self::grant) of a semaphore's `slot` (a lock: `None`). A
    /// reader-writer lock's node is granted with its access.
    pub(crate) fn grant_slot(
        &self,
        live: &Live,
        name: &LockName,
        entry: Entry,
        alone: bool,
        slot: Option<u32>,
    ) -> Result<Lease, LockError> {
        let node = entry
            .node
            .as_ref()
            .ok_or_else(|| LockError::store(BACKEND, "granted a queue entry without a node"))?;
        let (fence, alive_since) = (node.fence()?, node.alive_since);
        tracing::debug!(path = %node.path, %fence, "granted");
        let (session, access) = (entry.session.clone(), entry.access);
        // Whatever was asked, a lease lasts the negotiated session timeout.
        let ttl = self.capabilities().effective_ttl(session.timeout)?;
        let lease = Lease::new(
            name.clone(),
            OwnerToken::from_uuid(entry.guid),
            fence,
            ttl,
            alive_since,
        )
        .with_clock(entry.clock.clone())
        .with_extra_margin(session.timing.margin);
        let held = Held::start(entry, name.clone(), fence, alone, lease.deadline())
            .ok_or_else(|| LockError::store(BACKEND, "granted a queue entry without a node"))?;
        live.keeper.add(held.clone());
        let lease = lease
            .with_loss_signal(held.lost.clone())
            .with_extension(held);
        Ok(match (slot, access) {
            (Some(slot), _) => lease.with_slot(slot),
            (None, Some(access)) => lease.with_access(access),
            (None, None) => lease,
        })
    }

    /// Deletes the node of a grant whose deadline passed unrenewed, in the
    /// background: tried again while the connection is in trouble
    /// ([`Held::delete_expired`]).
    pub(crate) fn delete_expired_later(&self, held: &Arc<Held>) {
        let held = held.clone();
        self.cleanups
            .spawn(async move { held.delete_expired().await });
    }

    /// Deletes the grant's node if it is still this lease's.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.refuse_closed()?;
        let Some(held) = self.held(lease) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        if held.kept().is_some() {
            return self.release_kept(held).await;
        }
        if held.expire_if_due(Instant::now()) {
            self.delete_expired_later(held);
            return Ok(ReleaseOutcome::NotHeld);
        }
        if held.over() != Over::No {
            return Ok(ReleaseOutcome::NotHeld);
        }
        if held.session.is_ended() {
            gone(held);
            return Ok(ReleaseOutcome::NotHeld);
        }
        held.releasing();
        let deleted = held
            .delete()
            .await
            .map_err(|e| map(format!("releasing {}", held.path), e))?;
        held.finish(Over::Released);
        held.stop();
        if let Some(sequence) = held.sequence {
            held.session.lines.deleted(&held.parent, sequence);
        }
        // The node is gone (the server answered): a create sent from now on
        // that gets the next number is first.
        if let Some((watch, sequence)) = held.vouch {
            held.session.quiet.vouch(&held.parent, watch, sequence);
        }
        Ok(if deleted {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }
}
