//! Store-pushed loss: a held lock whose key disappears (lease expired or
//! revoked, forced release, an operator's delete) fires the lease's loss
//! signal the moment etcd reports the delete, instead of at the next renewal.
//!
//! It follows the deletes of the lock's queue on the instance's shared watch
//! ([`crate::hub`]), from a tenth of the TTL on (at most 250 ms, checked
//! every 50 ms by one scheduler task per client): short critical sections,
//! the hot path, never pay for it. Subscribing first and then reading the
//! key covers the time before: a delete before the subscription shows in
//! the read, one after it arrives as an event.
//!
//! So a connected holder learns of its key's delete within [`NOTICE`] plus
//! round trips (the watch's creation and the read, when the delete came
//! first): the watch starts at most 300 ms after the grant, and etcd may hold
//! a new watch's events back for one pass of its unsynced-watch loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::GetOptions;
use lockcore::backend::CancellationToken;
use tokio::time::Instant;

use crate::client::Inner;

/// How often the scheduler looks at grants waiting for their watch.
const TICK: Duration = Duration::from_millis(50);
/// The longest a grant waits for its watch (a tenth of its TTL, at most this).
const MAX_DELAY: Duration = Duration::from_millis(250);
/// etcd serves a watch whose creation raced a write (a watch "from now"
/// whose revision was read before the write) from a loop that runs every
/// 100 ms (`syncWatchersLoop`).
const UNSYNCED_LOOP: Duration = Duration::from_millis(100);
/// How soon a connected holder's loss signal fires after its key is deleted
/// (a forced release, a revocation), round trips aside.
pub(crate) const NOTICE: Duration = MAX_DELAY.saturating_add(TICK).saturating_add(UNSYNCED_LOOP);

/// Grants whose loss watch has not started yet. Registering one is a push
/// under a mutex: no task, no timer, no wake-up on the acquire path.
#[derive(Debug, Default)]
pub(crate) struct Watches {
    pending: Mutex<Vec<Pending>>,
    scheduler: AtomicBool,
}

#[derive(Debug)]
struct Pending {
    queue: Vec<u8>,
    key: Vec<u8>,
    revision: i64,
    start_at: Instant,
    lost: CancellationToken,
    done: CancellationToken,
}

/// Arranges for `key` (created at `revision`, in `queue`) to be watched
/// until it is deleted, then `lost` cancelled; nothing happens once `done` is
/// cancelled (released by its owner) or the backend is dropped.
pub(crate) fn register(
    inner: &Arc<Inner>,
    queue: Vec<u8>,
    key: Vec<u8>,
    revision: i64,
    ttl: Duration,
    lost: CancellationToken,
    done: CancellationToken,
) {
    let start_at = Instant::now() + (ttl / 10).min(MAX_DELAY);
    inner
        .watches
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Pending {
            queue,
            key,
            revision,
            start_at,
            lost,
            done,
        });
    if !inner.watches.scheduler.swap(true, Ordering::AcqRel) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(schedule(Arc::downgrade(inner)));
        } else {
            // No runtime: renewals still notice; let a later grant retry.
            inner.watches.scheduler.store(false, Ordering::Release);
        }
    }
}

/// Drops released grants, starts the watches that are due, and exits when
/// nothing is pending (the next registration starts it again).
async fn schedule(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(TICK).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let due: Vec<Pending> = {
            let mut pending = strong
                .watches
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            pending.retain(|p| !p.done.is_cancelled());
            let now = Instant::now();
            let (due, later) = std::mem::take(&mut *pending)
                .into_iter()
                .partition(|p| p.start_at <= now);
            *pending = later;
            if pending.is_empty() {
                // Cleared under the lock registrations push under: a later
                // registration sees the flag down and starts a new scheduler.
                strong.watches.scheduler.store(false, Ordering::Release);
                drop(pending);
                start_all(&strong, due);
                return;
            }
            due
        };
        start_all(&strong, due);
    }
}

fn start_all(inner: &Arc<Inner>, due: Vec<Pending>) {
    for p in due {
        spawn(inner, p);
    }
}

/// The watch itself, for one grant.
fn spawn(inner: &Arc<Inner>, grant: Pending) {
    let inner = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            if grant.done.is_cancelled() || grant.lost.is_cancelled() {
                return;
            }
            match watch_once(&inner, &grant).await {
                Outcome::Deleted => {
                    if !grant.done.is_cancelled() {
                        tracing::debug!(
                            revision = grant.revision,
                            "held lock key deleted in etcd: lease lost"
                        );
                        grant.lost.cancel();
                    }
                    return;
                }
                Outcome::Done => return,
                Outcome::Failed => {
                    failures = failures.saturating_add(1);
                    let pause = Duration::from_millis(100 * u64::from(failures.min(20)));
                    tokio::select! {
                        _ = grant.done.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    });
}

enum Outcome {
    Deleted,
    Done,
    Failed,
}

async fn watch_once(inner: &Weak<Inner>, grant: &Pending) -> Outcome {
    let Some(strong) = inner.upgrade() else {
        return Outcome::Done;
    };
    let (hub, mut client, timeout) = (strong.hub.clone(), strong.client.clone(), strong.timeout);
    drop(strong); // a waiting loss watch must not keep a dropped backend alive
    let subscribed = tokio::select! {
        _ = grant.done.cancelled() => return Outcome::Done,
        subscribed = hub.subscribe(&grant.queue) => subscribed,
    };
    drop(hub);
    let Ok(mut deletes) = subscribed else {
        return Outcome::Failed;
    };
    // Subscribed: a delete from now on arrives as an event, one before shows
    // in this (linearizable) read.
    let options = GetOptions::new().with_keys_only();
    match tokio::time::timeout(timeout, client.get(grant.key.clone(), Some(options))).await {
        Ok(Ok(reply))
            if reply
                .kvs()
                .iter()
                .any(|kv| kv.create_revision() == grant.revision) => {}
        Ok(Ok(_)) => return Outcome::Deleted,
        Ok(Err(_)) | Err(_) => return Outcome::Failed,
    }
    loop {
        let deleted = tokio::select! {
            _ = grant.done.cancelled() => return Outcome::Done,
            deleted = deletes.next() => deleted,
        };
        match deleted {
            // Deletes of the key up to our grant's revision are of earlier grants.
            Some(deleted) if deleted.key == grant.key && deleted.revision > grant.revision => {
                return Outcome::Deleted;
            }
            Some(_) => {}
            None => return Outcome::Failed,
        }
    }
}
