//! Waiting in line: a FIFO queue by create revision, each waiter watching
//! only its predecessor.
//!
//! 1. One `Txn` puts our entry (attached to our lease) and reads the two
//!    newest entries of the queue: ours and, if any, the one just before it.
//!    No predecessor: the lock is ours, in one round trip.
//! 2. Otherwise watch the predecessor for its delete, with a watch that
//!    starts *now* (so etcd registers it as synced and delivers the delete on
//!    its fast path, not from the 100 ms catch-up loop), and only once the
//!    watch is confirmed, check the queue again (a read-only `Txn`): our
//!    entry still exists and no entry older than ours is left → ours. An
//!    older entry that appeared before the watch was registered is caught by
//!    this check, so no delete is missed.
//! 3. While waiting, keep our lease alive (every third of its TTL), re-check
//!    every `WaitPolicy::recheck` in case a notification is lost, and give
//!    up at the deadline. If our lease expired anyway (etcd issue #11456
//!    territory), our entry is gone: we notice it in the check and queue
//!    again, never claiming a lock whose entry died.
//!
//! Cancellation: the entry is removed by a `Drop` guard (in the background),
//! and otherwise expires with its lease.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchFilterType,
    WatchOptions, WatchStream,
};
use lockcore::{Lease, LockError, LockName, OwnerToken, WaitPolicy};
use tokio::time::Instant;

use crate::backend::{Check, Inner, first_range};
use crate::error::{BACKEND, lease_not_found, protocol, timed};
use crate::keys::Keys;
use crate::leases::Slot;

/// `LockBackend::acquire`: queue, wait for our turn, retry transient errors
/// with the policy's backoff until its deadline.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    name: &LockName,
    ttl: Duration,
    wait: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let ttl = inner.caps.effective_ttl(ttl)?;
    let mut attempt: u32 = 0;
    loop {
        let failure = match wait_in_line(inner, name, ttl, wait).await {
            Ok(outcome) => return Ok(outcome),
            Err(e) if e.is_retryable() => e,
            Err(e) => return Err(e),
        };
        tracing::debug!(name = %name, attempt, error = %failure, "waiting for the lock failed, will retry");
        if Instant::now() >= wait.deadline {
            return Err(failure);
        }
        let pause = wait.backoff.delay(attempt);
        attempt = attempt.saturating_add(1);
        tokio::time::sleep_until((Instant::now() + pause).min(wait.deadline)).await;
    }
}

/// Our entry in the queue. Dropped while armed, it removes itself.
struct Entry {
    inner: Arc<Inner>,
    name: LockName,
    owner: OwnerToken,
    key: Vec<u8>,
    revision: i64,
    slot: Slot,
    armed: bool,
}

impl Entry {
    /// Puts our entry and reads our predecessor, in one `Txn`.
    async fn enqueue(
        inner: &Arc<Inner>,
        name: &LockName,
        ttl: Duration,
    ) -> Result<(Entry, Option<Vec<u8>>), LockError> {
        let queue = inner.keys.queue(name);
        let newest_two = GetOptions::new()
            .with_range(Keys::queue_end(&queue))
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2)
            .with_keys_only();
        for fresh_grant in [false, true] {
            let slot = if fresh_grant {
                inner.grant(ttl).await?
            } else {
                inner.take_lease(ttl).await?
            };
            let owner = OwnerToken::new();
            let key = inner.keys.entry(name, slot.id);
            let txn = Txn::new().and_then([
                TxnOp::put(
                    key.clone(),
                    owner.encode(),
                    Some(PutOptions::new().with_lease(slot.id)),
                ),
                TxnOp::get(queue.clone(), Some(newest_two.clone())),
            ]);
            let reply =
                tokio::time::timeout(inner.timeout, inner.client.kv_client().txn(txn)).await;
            let reply = match reply {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) if lease_not_found(&e) && !fresh_grant => continue,
                Ok(Err(e)) => {
                    inner.spawn_cleanup(key, None, slot);
                    return Err(crate::error::map(e));
                }
                Err(_) => {
                    inner.spawn_cleanup(key, None, slot);
                    return Err(LockError::unavailable(
                        BACKEND,
                        format!("enqueue got no answer within {:?}", inner.timeout),
                    ));
                }
            };
            let newest = first_range(&reply)?;
            let mine = newest
                .first()
                .filter(|kv| kv.key() == key.as_slice())
                .ok_or_else(|| protocol("our new queue entry is not the newest"))?;
            let entry = Entry {
                inner: inner.clone(),
                name: name.clone(),
                owner,
                revision: mine.create_revision(),
                key,
                slot,
                armed: true,
            };
            let predecessor = newest.get(1).map(|kv| kv.key().to_vec());
            return Ok((entry, predecessor));
        }
        Err(protocol("a freshly granted lease was not found"))
    }

    /// The lock is ours: hand out the lease, no cleanup.
    fn into_lease(mut self) -> Result<Lease, LockError> {
        self.armed = false;
        let fence = self.inner.fence(self.revision)?;
        Ok(self
            .inner
            .lease_for(&self.name, self.owner, fence, self.slot))
    }

    /// The local deadline of our lease.
    fn lease_deadline(&self) -> Instant {
        self.slot.refreshed + self.slot.ttl.saturating_sub(Lease::drift(self.slot.ttl))
    }

    /// Removes the entry now (giving up at the deadline); falls back to the
    /// background cleanup on error.
    async fn remove(mut self) {
        match self
            .inner
            .delete_entry(&self.key, self.revision, self.owner)
            .await
        {
            Ok(deleted) => {
                self.armed = false;
                if deleted {
                    self.inner.pool.give_back(self.slot);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "removing a queue entry failed; retrying in the background")
            }
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.armed {
            self.inner.spawn_cleanup(
                self.key.clone(),
                Some((self.revision, self.owner)),
                self.slot,
            );
        }
    }
}

/// One turn in the queue: `Ok(Some)` when granted, `Ok(None)` at the
/// deadline, `Err` when the store failed (the caller retries).
async fn wait_in_line(
    inner: &Arc<Inner>,
    name: &LockName,
    ttl: Duration,
    wait: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let (mut entry, predecessor) = Entry::enqueue(inner, name, ttl).await?;
    let Some(mut predecessor) = predecessor else {
        return entry.into_lease().map(Some);
    };
    let mut failures: u32 = 0;
    'watch: loop {
        let (mut watch, created_at) = match open_watch(inner, &predecessor).await {
            Ok(watch) => watch,
            Err(e) if e.is_retryable() => {
                failures += 1;
                pause_or_give_up(&entry, wait, failures, e).await?;
                continue 'watch;
            }
            Err(e) => return Err(e),
        };
        // Check at the revision the watch started from: anything deleted
        // before it shows in the snapshot, anything after arrives as an event.
        let mut check_now = Some(created_at);
        let mut recheck_at = Instant::now() + wait.recheck;
        let mut keep_alive_at = entry.slot.refreshed + ttl / 3;
        loop {
            if let Some(at) = check_now.take() {
                // Never read before our own entry existed: a watch served by a
                // lagging member reports a revision older than our put.
                let at = at.map(|at| at.max(entry.revision));
                match inner.check(name, &entry.key, entry.revision, at).await {
                    Ok(Check::Head) => return entry.into_lease().map(Some),
                    Ok(Check::Behind(key)) if key == predecessor => {}
                    Ok(Check::Behind(key)) => {
                        predecessor = key;
                        continue 'watch;
                    }
                    Ok(Check::Gone) => {
                        // Our lease died. The entry stays armed: its cleanup is
                        // a no-op then, and harmless insurance otherwise.
                        return Err(LockError::unavailable(
                            BACKEND,
                            "our queue entry expired while waiting; queueing again",
                        ));
                    }
                    Err(e) if e.is_retryable() => {
                        failures += 1;
                        pause_or_give_up(&entry, wait, failures, e).await?;
                        check_now = Some(None);
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                recheck_at = Instant::now() + wait.recheck;
            }
            tokio::select! {
                biased;
                message = watch.message() => match message {
                    Ok(Some(reply)) if reply.canceled() => continue 'watch,
                    Ok(Some(reply)) => {
                        if reply.events().iter().any(|e| e.event_type() == EventType::Delete) {
                            // The member that sent this has applied the delete:
                            // a snapshot there at the reply's revision is exact.
                            check_now = Some(reply.header().map(|h| h.revision()));
                        }
                    }
                    Ok(None) | Err(_) => {
                        failures += 1;
                        let e = LockError::unavailable(BACKEND, "the watch stream ended");
                        pause_or_give_up(&entry, wait, failures, e).await?;
                        continue 'watch;
                    }
                },
                _ = tokio::time::sleep_until(keep_alive_at) => {
                    let sent = Instant::now();
                    match inner.keep_alive(entry.slot.id).await {
                        Ok(true) => {
                            entry.slot.refreshed = sent;
                            keep_alive_at = sent + ttl / 3;
                        }
                        Ok(false) => check_now = Some(None), // the check will find us gone
                        Err(e) => {
                            tracing::debug!(error = %e, "keep-alive while waiting failed");
                            if Instant::now() >= entry.lease_deadline() {
                                // Cannot know whether our entry survived: leave
                                // it to its cleanup and queue again.
                                return Err(e);
                            }
                            keep_alive_at = Instant::now() + ttl / 10;
                        }
                    }
                }
                _ = tokio::time::sleep_until(recheck_at) => check_now = Some(None),
                _ = tokio::time::sleep_until(wait.deadline) => {
                    entry.remove().await;
                    return Ok(None);
                }
            }
        }
    }
}

/// Waits `backoff(failures)` before trying again, or gives up: at the
/// deadline (removing our entry) or once our lease may have lapsed.
async fn pause_or_give_up(
    entry: &Entry,
    wait: &WaitPolicy,
    failures: u32,
    error: LockError,
) -> Result<(), LockError> {
    let now = Instant::now();
    if now >= wait.deadline || now >= entry.lease_deadline() {
        return Err(error);
    }
    let pause = wait.backoff.delay(failures.saturating_sub(1));
    tokio::time::sleep_until((now + pause).min(wait.deadline)).await;
    Ok(())
}

/// A watch for the delete of `key`, starting now, confirmed by etcd; with
/// the revision it was created at.
async fn open_watch(inner: &Inner, key: &[u8]) -> Result<(WatchStream, Option<i64>), LockError> {
    let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    timed(inner.timeout, "watch", async {
        let mut stream = inner
            .client
            .watch_client()
            .watch(key.to_vec(), Some(options))
            .await?;
        loop {
            match stream.message().await? {
                Some(reply) if reply.created() => {
                    if reply.canceled() {
                        return Err(etcd_client::Error::WatchError(format!(
                            "watch refused: {}",
                            reply.cancel_reason()
                        )));
                    }
                    let at = reply.header().map(|h| h.revision());
                    return Ok((stream, at));
                }
                Some(_) => {}
                None => {
                    return Err(etcd_client::Error::WatchError(
                        "watch stream closed before it was created".into(),
                    ));
                }
            }
        }
    })
    .await
}
