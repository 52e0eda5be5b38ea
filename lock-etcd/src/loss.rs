//! Store-pushed loss: a held lock whose key disappears (lease expired or
//! revoked, forced release, an operator's delete) fires the lease's loss
//! signal the moment etcd reports the delete, instead of at the next renewal.
//!
//! The watch is opened only once the lock has been held a little while
//! (a tenth of the TTL, at most 250 ms, checked every 50 ms by one scheduler
//! task per client): short critical sections, the hot path, never pay for
//! it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchFilterType, WatchOptions};
use lockcore::CancellationToken;
use tokio::time::Instant;

use crate::backend::Inner;

/// How often the scheduler looks at grants waiting for their watch.
const TICK: Duration = Duration::from_millis(50);

/// Grants whose loss watch has not started yet. Registering one is a push
/// under a mutex: no task, no timer, no wake-up on the acquire path.
#[derive(Debug, Default)]
pub(crate) struct Watches {
    pending: Mutex<Vec<Pending>>,
    scheduler: AtomicBool,
}

#[derive(Debug)]
struct Pending {
    key: Vec<u8>,
    revision: i64,
    start_at: Instant,
    lost: CancellationToken,
    done: CancellationToken,
}

/// Arranges for `key` (created at `revision`) to be watched until it is
/// deleted, then `lost` cancelled; nothing happens once `done` is cancelled
/// (released by its owner) or the backend is dropped.
pub(crate) fn register(
    inner: &Arc<Inner>,
    key: Vec<u8>,
    revision: i64,
    ttl: Duration,
    lost: CancellationToken,
    done: CancellationToken,
) {
    let start_at = Instant::now() + (ttl / 10).min(Duration::from_millis(250));
    inner
        .watches
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Pending {
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
        spawn(inner, p.key, p.revision, p.lost, p.done);
    }
}

/// The watch itself, for one grant.
fn spawn(
    inner: &Arc<Inner>,
    key: Vec<u8>,
    revision: i64,
    lost: CancellationToken,
    done: CancellationToken,
) {
    let inner = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut from = revision + 1;
        let mut failures = 0u32;
        loop {
            if done.is_cancelled() || lost.is_cancelled() {
                return;
            }
            match watch_once(&inner, &key, revision, from, &done).await {
                Outcome::Deleted => {
                    if !done.is_cancelled() {
                        tracing::debug!(revision, "held lock key deleted in etcd: lease lost");
                        lost.cancel();
                    }
                    return;
                }
                Outcome::Done => return,
                Outcome::Compacted => from = 0,
                Outcome::Failed => {
                    failures = failures.saturating_add(1);
                    let pause = Duration::from_millis(100 * u64::from(failures.min(20)));
                    tokio::select! {
                        _ = done.cancelled() => return,
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
    Compacted,
    Failed,
}

async fn watch_once(
    inner: &Weak<Inner>,
    key: &[u8],
    revision: i64,
    from: i64,
    done: &CancellationToken,
) -> Outcome {
    let Some(strong) = inner.upgrade() else {
        return Outcome::Done;
    };
    let mut client = strong.client.clone();
    let timeout = strong.timeout;
    drop(strong); // an open watch must not keep a dropped backend alive
    let mut options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
    if from > 0 {
        options = options.with_start_revision(from);
    }
    let opened = tokio::time::timeout(timeout, client.watch(key.to_vec(), Some(options))).await;
    let Ok(Ok(mut stream)) = opened else {
        return Outcome::Failed;
    };
    let mut verified = from > 0;
    loop {
        let message = tokio::select! {
            _ = done.cancelled() => return Outcome::Done,
            message = stream.message() => message,
        };
        match message {
            Ok(Some(reply)) if reply.compact_revision() > 0 => return Outcome::Compacted,
            Ok(Some(reply)) if reply.canceled() => return Outcome::Failed,
            Ok(Some(reply)) => {
                if reply
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Outcome::Deleted;
                }
                if !verified && reply.created() {
                    // Watching from "now" (after a compaction): make sure the
                    // key still existed when the watch started.
                    // Not before the key's creation (a lagging member's header).
                    let at = reply.header().map_or(0, |h| h.revision()).max(revision);
                    let get = client
                        .get(
                            key.to_vec(),
                            Some(GetOptions::new().with_keys_only().with_revision(at)),
                        )
                        .await;
                    match get {
                        Ok(reply)
                            if reply
                                .kvs()
                                .iter()
                                .any(|kv| kv.create_revision() == revision) =>
                        {
                            verified = true;
                        }
                        Ok(_) => return Outcome::Deleted,
                        Err(_) => return Outcome::Failed,
                    }
                }
            }
            Ok(None) | Err(_) => return Outcome::Failed,
        }
    }
}
