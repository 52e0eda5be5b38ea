//! Testing your code, example 1: a worker must stop writing once its lease
//! is lost. The store stops answering renewals; the lease runs out at its
//! deadline and `lost()` fires; after that, not one more write.

#![cfg(feature = "testing")]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock::testing::{RecordingResource, TestStore};
use distlock::{LockGuard, Locker};
use tokio::time::{interval, sleep, timeout};

type Ledger = RecordingResource<Vec<u32>>;

/// The application: appends a batch to the ledger every second while it
/// holds the lock, and stops the moment the lease is lost.
async fn worker(guard: LockGuard, ledger: Arc<Ledger>) {
    let mut every_second = interval(Duration::from_secs(1));
    for batch in 0.. {
        tokio::select! {
            // `biased`: a loss and a tick at one instant, the loss wins.
            biased;
            _ = guard.lost() => return,
            _ = every_second.tick() => {}
        }
        if ledger
            .write(guard.fencing_token(), |l| l.push(batch))
            .is_err()
        {
            return;
        }
    }
}

/// A wrong application: never looks at `lost()`, and stops only once the
/// ledger refuses a write.
async fn worker_ignoring_loss(guard: LockGuard, ledger: Arc<Ledger>) {
    let mut every_second = interval(Duration::from_secs(1));
    for batch in 0.. {
        every_second.tick().await;
        if ledger
            .write(guard.fencing_token(), |l| l.push(batch))
            .is_err()
        {
            return;
        }
    }
}

/// How long after `lost()` the worker may take to stop.
const STOP_WITHIN: Duration = Duration::from_secs(1);

/// Runs `worker` on a 30 s lease; after 5 s the store stops answering
/// renewals, so the lease is lost at its deadline (about 29.7 s). Returns
/// the ledger, and whether the worker had stopped `STOP_WITHIN` later.
async fn store_stops_answering<W, F>(worker: W) -> (Arc<Ledger>, bool)
where
    W: FnOnce(LockGuard, Arc<Ledger>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let store = TestStore::new();
    let client = store.client();
    let faults = client.faults();
    let locker = Locker::new(client).ttl(Duration::from_secs(30));
    let ledger = Arc::new(Ledger::new(Vec::new()));

    let guard = locker.acquire("ledger").await.unwrap();
    ledger.watch(&guard);
    let lost = guard.lost_token();
    let working = tokio::spawn(worker(guard, ledger.clone()));

    sleep(Duration::from_secs(5)).await;
    faults.hang_renewals();
    lost.cancelled().await;
    let stopped = timeout(STOP_WITHIN, working).await.is_ok();
    (ledger, stopped)
}

#[tokio::test(start_paused = true)]
async fn the_worker_stops_writing_when_its_lease_is_lost() {
    let (ledger, stopped) = store_stops_answering(worker).await;
    ledger.assert_no_write_after_loss();
    assert!(stopped, "the worker still ran {STOP_WITHIN:?} after lost()");
    assert_eq!(ledger.read(), (0..30).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn the_kit_catches_a_worker_that_ignores_lost() {
    let (ledger, stopped) = store_stops_answering(worker_ignoring_loss).await;
    let caught = ledger.check_no_write_after_loss().unwrap_err();
    // Nobody else took the lock, so the fence check let the write through:
    // only the kit sees that the worker wrote on without its lease.
    assert_eq!(caught.writes.len(), 1, "{caught}");
    assert_eq!(caught.writes[0].outcome, Ok(()));
    assert!(!stopped);
    assert!(
        caught
            .to_string()
            .contains("after its guard's lost() fired, applied"),
        "{caught}"
    );
}
