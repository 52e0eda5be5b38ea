//! Waiting in line: a FIFO queue by create revision.
//!
//! 1. One `Txn` puts our entry (attached to our lease) and reads the keys of
//!    the queue. The entries older than ours are the line ahead of us; none,
//!    and the lock is ours in one round trip.
//! 2. Otherwise follow the queue's deletes on this instance's shared watch
//!    ([`crate::hub`]) and strike each deleted entry from the line ahead.
//!    Once it is empty the lock is ours: between the holder's delete and our
//!    grant there is no read, no write and no watch to set up. This is exact,
//!    not optimistic: entries only ever get newer revisions, so the line
//!    ahead can only shrink, and the watch delivers every delete, in
//!    revision order.
//! 3. The watch must cover everything after the state we start from. On a
//!    name this instance already watches (a busy one), we subscribe before
//!    the enqueue, and its read is the start. Otherwise we subscribe
//!    (creating the watch) after the enqueue and read the line again. That
//!    read also starts over after the stream failed, and runs every
//!    `WaitPolicy::recheck` as insurance.
//! 4. While waiting, keep our lease alive (every third of its TTL) and give
//!    up at the deadline. Our own entry's delete (our lease expired, etcd
//!    issue #11456 territory, or a forced release) means we queue again,
//!    never claiming a lock whose entry died.
//!
//! Cancellation: the entry is removed by a `Drop` guard (in the background),
//! and otherwise expires with its lease.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use lockcore::backend::WaitPolicy;
use lockcore::{Lease, LockError, LockName, OwnerToken};
use tokio::time::Instant;

use crate::client::{Inner, first_range};
use crate::error::{BACKEND, lease_not_found, protocol};
use crate::hub::Deleted;
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
    /// Puts our entry and reads the queue, in one `Txn`: the entry, and the
    /// line ahead of it as of this write.
    async fn enqueue(
        inner: &Arc<Inner>,
        name: &LockName,
        ttl: Duration,
    ) -> Result<(Entry, Line), LockError> {
        let queue = inner.keys.queue(name);
        let all = GetOptions::new()
            .with_range(Keys::queue_end(&queue))
            .with_keys_only();
        for fresh_grant in [false, true] {
            let slot = inner.entry_lease(ttl, fresh_grant).await?;
            let owner = OwnerToken::new();
            let key = inner.keys.entry(name, slot.id);
            let txn = Txn::new().and_then([
                TxnOp::put(
                    key.clone(),
                    owner.encode(),
                    Some(PutOptions::new().with_lease(slot.id)),
                ),
                TxnOp::get(queue.clone(), Some(all.clone())),
            ]);
            let reply =
                tokio::time::timeout(inner.timeout, inner.client.kv_client().txn(txn)).await;
            let reply = match reply {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) if lease_not_found(&e) && !fresh_grant => continue,
                // The put may or may not have happened, or happen later.
                Ok(Err(e)) => {
                    inner.abandon(slot);
                    return Err(crate::error::map(e));
                }
                Err(_) => {
                    inner.abandon(slot);
                    return Err(LockError::unavailable(
                        BACKEND,
                        format!("enqueue got no answer within {:?}", inner.timeout),
                    ));
                }
            };
            let at = reply.header().map_or(0, |h| h.revision());
            // A reply without the range fails like one without our entry.
            let entries = first_range(&reply).unwrap_or_default();
            let Some(revision) = entries
                .iter()
                .find(|kv| kv.key() == key.as_slice())
                .map(KeyValue::create_revision)
            else {
                inner.abandon(slot);
                return Err(protocol("our new entry is missing from the queue"));
            };
            let line = Line::new(at, revision, &entries);
            let entry = Entry {
                inner: inner.clone(),
                name: name.clone(),
                owner,
                revision,
                key,
                slot,
                armed: true,
            };
            return Ok((entry, line));
        }
        Err(protocol("a freshly granted lease was not found"))
    }

    /// The lock is ours: hand out the lease, no cleanup.
    fn into_lease(mut self) -> Result<Lease, LockError> {
        self.armed = false;
        let fence = self.inner.fence(self.revision)?;
        self.inner
            .lease_for(&self.name, self.owner, fence, self.slot)
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
            self.inner
                .spawn_cleanup(self.key.clone(), self.revision, self.owner, self.slot);
        }
    }
}

/// The entries ahead of ours as of revision `at`, kept current with the
/// queue's deletes after it.
#[derive(Debug)]
struct Line {
    at: i64,
    ahead: HashSet<Vec<u8>>,
    /// Our own entry was deleted.
    gone: bool,
}

impl Line {
    /// The line ahead of the entry created at `mine`, from a read of the
    /// queue at `at`.
    fn new(at: i64, mine: i64, queue: &[KeyValue]) -> Self {
        Line {
            at,
            ahead: queue
                .iter()
                .filter(|kv| kv.create_revision() < mine)
                .map(|kv| kv.key().to_vec())
                .collect(),
            gone: false,
        }
    }

    fn apply(&mut self, mine: &[u8], deleted: Deleted) {
        if deleted.revision <= self.at {
            return; // already in the read we started from
        }
        if deleted.key == mine {
            self.gone = true;
        } else {
            self.ahead.remove(&deleted.key);
        }
    }
}

/// Where our entry stands now: a linearizable read of our entry and the
/// entries older than it.
async fn read_line(inner: &Inner, name: &LockName, entry: &Entry) -> Result<Line, LockError> {
    let queue = inner.keys.queue(name);
    let older = GetOptions::new()
        .with_range(Keys::queue_end(&queue))
        // 0 would mean "no bound"; revision 1 is etcd's empty initial state.
        .with_max_create_revision((entry.revision - 1).max(1))
        .with_keys_only();
    let txn = Txn::new().and_then([
        TxnOp::get(entry.key.clone(), Some(GetOptions::new().with_keys_only())),
        TxnOp::get(queue, Some(older)),
    ]);
    let reply = inner.txn("queue check", txn).await?;
    let at = reply.header().map_or(0, |h| h.revision());
    let mut ranges = reply.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
        _ => None,
    });
    let (Some(mine), Some(older)) = (ranges.next(), ranges.next()) else {
        return Err(protocol("a queue check without its two ranges"));
    };
    let mut line = Line::new(at, entry.revision, &older);
    line.gone = !mine.iter().any(|kv| kv.create_revision() == entry.revision);
    Ok(line)
}

/// One turn in the queue: `Ok(Some)` when granted, `Ok(None)` at the
/// deadline, `Err` when the store failed (the caller retries).
async fn wait_in_line(
    inner: &Arc<Inner>,
    name: &LockName,
    ttl: Duration,
    wait: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let queue = inner.keys.queue(name);
    // Free when this instance already watches the name.
    let mut subscription = inner.hub.existing(&queue);
    let (mut entry, mut line) = Entry::enqueue(inner, name, ttl).await?;
    // Without a subscription from before the enqueue, its read is no start.
    let mut stale = subscription.is_none();
    let mut failures: u32 = 0;
    let recheck = tokio::time::sleep(wait.recheck);
    let keep_alive = tokio::time::sleep_until(entry.slot.refreshed + ttl / 3);
    let deadline = tokio::time::sleep_until(wait.deadline);
    tokio::pin!(recheck, keep_alive, deadline);
    loop {
        // The line reflects etcd's history up to some revision, so these
        // hold even when it is stale: the line ahead never grows back.
        if line.gone {
            // Our lease died. The entry stays armed: its cleanup is a no-op
            // then, and harmless insurance otherwise.
            return Err(LockError::unavailable(
                BACKEND,
                "our queue entry expired while waiting; queueing again",
            ));
        }
        if line.ahead.is_empty() {
            return entry.into_lease().map(Some);
        }
        if stale {
            // (Re)join: subscribe first, then read where we stand.
            if subscription.is_none() {
                subscription = match inner.hub.subscribe(&queue).await {
                    Ok(subscription) => Some(subscription),
                    Err(e) if e.is_retryable() => {
                        failures += 1;
                        pause_or_give_up(&entry, wait, failures, e).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
            }
            match read_line(inner, name, &entry).await {
                Ok(fresh) => {
                    line = fresh;
                    stale = false;
                    let now = Instant::now();
                    recheck
                        .as_mut()
                        .reset(now.checked_add(wait.recheck).unwrap_or(wait.deadline));
                }
                Err(e) if e.is_retryable() => {
                    failures += 1;
                    pause_or_give_up(&entry, wait, failures, e).await?;
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        let Some(deletes) = subscription.as_mut() else {
            stale = true;
            continue;
        };
        tokio::select! {
            biased;
            deleted = deletes.next() => match deleted {
                Some(deleted) => line.apply(&entry.key, deleted),
                None => {
                    // The watch is gone, deletes may have been missed.
                    subscription = None;
                    stale = true;
                    failures += 1;
                    let e = LockError::unavailable(BACKEND, "the watch stream ended");
                    pause_or_give_up(&entry, wait, failures, e).await?;
                }
            },
            () = &mut keep_alive => {
                let sent = Instant::now();
                match inner.keep_alive(entry.slot.id).await {
                    Ok(true) => {
                        entry.slot.refreshed = sent;
                        keep_alive.as_mut().reset(sent + ttl / 3);
                    }
                    Ok(false) => {
                        stale = true; // the read will find us gone
                        keep_alive.as_mut().reset(sent + ttl / 3);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "keep-alive while waiting failed");
                        if Instant::now() >= entry.lease_deadline() {
                            // Cannot know whether our entry survived: leave
                            // it to its cleanup and queue again.
                            return Err(e);
                        }
                        keep_alive.as_mut().reset(Instant::now() + ttl / 10);
                    }
                }
            }
            () = &mut recheck => stale = true,
            () = &mut deadline => {
                entry.remove().await;
                return Ok(None);
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
