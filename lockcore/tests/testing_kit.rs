//! The test kit's controls, each on tokio's paused clock: what the holder
//! sees, when, and what the store's history says.

use std::time::Duration;

use lockcore::testing::{Change, Faults, RecordingResource, TestStore};
use lockcore::{HolderLabel, Lease, LockError, LockGuard, Locker, LossReason};
use tokio::time::{Instant, timeout};

const TTL: Duration = Duration::from_secs(30);
/// The default renew interval: a third of the TTL.
const RENEW_EVERY: Duration = Duration::from_secs(10);

fn locker(store: &TestStore, label: &str) -> Locker {
    faulty_locker(store, label).0
}

/// A locker on a new client of `store`, and that client's faults.
fn faulty_locker(store: &TestStore, label: &str) -> (Locker, Faults) {
    let client = store.client();
    let faults = client.faults();
    let locker = Locker::new(client)
        .ttl(TTL)
        .label(HolderLabel::new(label).unwrap());
    (locker, faults)
}

/// When a lease whose last renewal was sent at `sent` is lost locally.
fn deadline(sent: Instant) -> Instant {
    sent + TTL - Lease::drift(TTL)
}

/// Whether `guard` is still held after `d` more of (paused) time.
async fn survives(guard: &LockGuard, d: Duration) -> bool {
    timeout(d, guard.lost()).await.is_err()
}

#[tokio::test(start_paused = true)]
async fn expire_frees_the_name_at_once_and_the_holder_learns_at_its_next_renewal() {
    let store = TestStore::new();
    let (a, b) = (locker(&store, "a"), locker(&store, "b"));
    let guard = a.acquire("job").await.unwrap();
    let started = Instant::now();

    let expired = store.expire("job").expect("a holder to expire");
    assert_eq!(expired.fence, guard.fencing_token());
    let taken = b
        .try_acquire("job")
        .await
        .unwrap()
        .expect("the name is free");
    assert!(taken.fencing_token() > guard.fencing_token());

    assert_eq!(guard.lost().await, LossReason::RenewalRefused);
    assert_eq!(started.elapsed(), RENEW_EVERY);
    assert!(store.expire("nothing-here").is_none());
}

#[tokio::test(start_paused = true)]
async fn evict_fires_lost_at_once_and_the_next_fence_is_larger() {
    let store = TestStore::new();
    let a = locker(&store, "a");
    let guard = a.acquire("job").await.unwrap();
    let started = Instant::now();

    let evicted = store.evict("job").await.expect("a holder to evict");
    assert_eq!(evicted.fence, guard.fencing_token());
    assert_eq!(guard.lost().await, LossReason::StoreReported);
    assert_eq!(started.elapsed(), Duration::ZERO);
    let next = a.try_acquire("job").await.unwrap().expect("free");
    assert!(next.fencing_token() > evicted.fence);
    assert!(store.evict("nothing-here").await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_few_failed_renewals_are_ridden_out() {
    let store = TestStore::new();
    let (a, faults) = faulty_locker(&store, "a");
    let guard = a.acquire("job").await.unwrap();
    let started = Instant::now();

    faults.fail_renewals(3);
    assert!(survives(&guard, 3 * TTL).await);
    let renewed: Vec<_> = store
        .history()
        .iter()
        .filter(|e| e.change == Change::Renewed)
        .map(|e| e.at - started)
        .collect();
    // The calls at 10 s failed three times, retried within a second; then
    // one renewal per interval.
    assert_eq!(renewed.len(), 8, "{renewed:?}");
    assert!(
        renewed[0] > RENEW_EVERY && renewed[0] < RENEW_EVERY + Duration::from_secs(1),
        "{renewed:?}"
    );
}

/// Holds "job" on a client of `store` labelled "a", switches `fault` on,
/// and checks the guard is lost at its deadline (renewals unanswered), not
/// a moment earlier. The client's locker, its faults, the lost guard (whose
/// drop releases the name) and when the lease's last renewal was sent.
async fn lost_at_deadline_under(
    store: &TestStore,
    fault: impl FnOnce(&Faults),
) -> (Locker, Faults, LockGuard, Instant) {
    let (a, faults) = faulty_locker(store, "a");
    let guard = a.acquire("job").await.unwrap();
    let sent = Instant::now();
    fault(&faults);
    assert_eq!(guard.lost().await, LossReason::RenewalUnanswered);
    assert_eq!(Instant::now(), deadline(sent));
    (a, faults, guard, sent)
}

#[tokio::test(start_paused = true)]
async fn renewals_failing_until_healed_lose_the_lease_at_its_deadline() {
    let store = TestStore::new();
    let b = locker(&store, "b");
    let (a, faults, _lost, sent) =
        lost_at_deadline_under(&store, Faults::fail_renewals_until_healed).await;
    // The store keeps the name until its TTL runs out, then hands it on.
    assert!(b.try_acquire("job").await.unwrap().is_none());
    let _taken = b.acquire_timeout("job", TTL).await.unwrap();
    assert_eq!(Instant::now(), sent + TTL);

    faults.heal();
    let _healed = a.try_acquire("other").await.unwrap().expect("healed");
}

#[tokio::test(start_paused = true)]
async fn hung_renewals_lose_the_lease_at_its_deadline() {
    let store = TestStore::new();
    let _lost = lost_at_deadline_under(&store, Faults::hang_renewals).await;
    assert!(store.history().iter().all(|e| e.change != Change::Renewed));
}

#[tokio::test(start_paused = true)]
async fn a_hung_renewal_healed_before_the_deadline_keeps_the_lease() {
    let store = TestStore::new();
    let (a, faults) = faulty_locker(&store, "a");
    let guard = a.acquire("job").await.unwrap();
    let started = Instant::now();

    faults.hang_renewals();
    assert!(survives(&guard, Duration::from_secs(15)).await);
    faults.heal();
    assert!(survives(&guard, 2 * TTL).await);
    let first_renewal = store
        .history()
        .into_iter()
        .find(|e| e.change == Change::Renewed)
        .expect("a renewal");
    // Sent at 10 s, it reached the store when healed.
    assert_eq!(first_renewal.at - started, Duration::from_secs(15));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_released_into_a_partition_does_not_reach_the_store() {
    let store = TestStore::new();
    store.faults().hang_renewals();
    let _lost = lost_at_deadline_under(&store, |faults| {
        let (faults, store_faults) = (faults.clone(), store.faults());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(15)).await;
            faults.partition();
            store_faults.heal();
        });
    })
    .await;
    assert!(store.history().iter().all(|e| e.change != Change::Renewed));
}

#[tokio::test(start_paused = true)]
async fn a_partition_fails_every_call_until_healed() {
    let store = TestStore::new();
    let b = locker(&store, "b");
    let (a, faults, _lost, _) = lost_at_deadline_under(&store, |faults| {
        faults.partition();
    })
    .await;
    let refused = a.try_acquire("other").await.unwrap_err();
    assert!(
        matches!(refused, LockError::Unavailable { .. }) && refused.is_retryable(),
        "{refused:?}"
    );
    // Only this client is cut off.
    assert!(b.try_acquire("job").await.unwrap().is_none());

    faults.heal();
    let _healed = a.try_acquire("other").await.unwrap().expect("healed");
}

#[tokio::test(start_paused = true)]
async fn store_faults_reach_every_client() {
    let store = TestStore::new();
    let (a, b) = (locker(&store, "a"), locker(&store, "b"));
    store.faults().partition();
    assert!(a.try_acquire("job").await.is_err());
    assert!(b.try_acquire("job").await.is_err());
    store.faults().heal();
    let _healed = a.try_acquire("job").await.unwrap().expect("healed");
}

#[tokio::test(start_paused = true)]
async fn delayed_replies_take_their_delay_on_the_paused_clock() {
    let store = TestStore::new();
    let (a, faults) = faulty_locker(&store, "a");

    faults.delay_replies(Duration::from_secs(2));
    let started = Instant::now();
    let guard = a.try_acquire("job").await.unwrap().expect("free");
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    // The store granted at once; the deadline counts from the send.
    assert_eq!(store.history()[0].at, started);
    assert_eq!(guard.lease().deadline(), deadline(started));

    faults.delay_replies(Duration::ZERO);
    let started = Instant::now();
    let _free = a.try_acquire("other").await.unwrap().expect("free");
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_phantom_holds_the_name_until_its_ttl() {
    let store = TestStore::new();
    let a = locker(&store, "a");
    let phantom = store
        .hold_as("job", "crashed-node", Duration::from_secs(5))
        .await;
    let started = Instant::now();

    let holder = a.inspect("job").await.unwrap().expect("held");
    assert_eq!(holder.label.unwrap().as_str(), "crashed-node");
    assert!(a.try_acquire("job").await.unwrap().is_none());
    let guard = a.acquire("job").await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert!(guard.fencing_token() > phantom.fence());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_after_exactly_its_wait() {
    let store = TestStore::new();
    let _rival = store.hold_as("job", "rival", TTL).await;
    let started = Instant::now();
    let waited = locker(&store, "a")
        .acquire_timeout("job", Duration::from_secs(3))
        .await
        .unwrap_err();
    assert!(matches!(waited, LockError::Timeout { .. }), "{waited:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn history_lists_every_grant_and_its_end_in_order() {
    let store = TestStore::new();
    let a = locker(&store, "a");
    let started = Instant::now();
    store
        .hold_as("job", "phantom", Duration::from_secs(5))
        .await;
    // Granted the instant the phantom's lease expired.
    let guard = a.acquire("job").await.unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    guard.release().await.unwrap();
    let evicted = a.acquire("job").await.unwrap();
    store.evict("job").await;
    drop(evicted);
    store.hold_as("job", "expired-by-test", TTL).await;
    store.expire("job");

    let seen: Vec<_> = store
        .history()
        .iter()
        .map(|e| {
            (
                e.change,
                e.label.as_str().to_owned(),
                (e.at - started).as_secs(),
            )
        })
        .collect();
    let expected = [
        (Change::Granted, "phantom", 0),
        (Change::Expired, "phantom", 5),
        (Change::Granted, "a", 5),
        (Change::Renewed, "a", 15),
        (Change::Released, "a", 17),
        (Change::Granted, "a", 17),
        (Change::Evicted, "a", 17),
        (Change::Granted, "expired-by-test", 17),
        (Change::Expired, "expired-by-test", 17),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(c, l, s)| (*c, (*l).to_owned(), *s))
        .collect();
    assert_eq!(seen, expected);
    // Fences only grow from grant to grant.
    let fences: Vec<_> = store
        .history()
        .iter()
        .filter(|e| e.change == Change::Granted)
        .map(|e| e.fence)
        .collect();
    assert!(fences.is_sorted() && fences.len() == 4, "{fences:?}");
}

#[tokio::test(start_paused = true)]
async fn the_recording_resource_flags_writes_after_the_loss_even_refused_ones() {
    let store = TestStore::new();
    let (a, b) = (locker(&store, "a"), locker(&store, "b"));
    let ledger = RecordingResource::new(0_u32);
    let old = a.acquire("ledger").await.unwrap();
    ledger.watch(&old);
    ledger.write(old.fencing_token(), |n| *n += 1).unwrap();
    ledger.assert_no_write_after_loss();

    store.evict("ledger").await;
    old.lost().await;
    let new = b.acquire("ledger").await.unwrap();
    ledger.watch(&new);
    ledger.write(new.fencing_token(), |n| *n += 10).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The zombie writes on: refused by the fence check, and still flagged.
    let refused = ledger.write(old.fencing_token(), |n| *n += 1).unwrap_err();
    assert_eq!(refused.highest, new.fencing_token());

    let late = ledger.check_no_write_after_loss().unwrap_err();
    assert_eq!(late.writes.len(), 1, "{late}");
    assert_eq!(late.writes[0].fence, old.fencing_token());
    assert_eq!(late.writes[0].after_loss, Some(Duration::from_secs(3)));
    assert_eq!(late.writes[0].outcome, Err(refused));
    assert_eq!(ledger.attempts().len(), 3);
    assert_eq!(ledger.read(), 11);
    assert!(
        late.to_string()
            .starts_with("1 write(s) attempted after the lease was lost:"),
        "{late}"
    );
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "write(s) attempted after the lease was lost")]
async fn assert_no_write_after_loss_fails_the_test() {
    let store = TestStore::new();
    let guard = locker(&store, "a").acquire("ledger").await.unwrap();
    let ledger = RecordingResource::new(());
    ledger.watch(&guard);
    store.evict("ledger").await;
    guard.lost().await;
    let _ = ledger.write(guard.fencing_token(), |()| ());
    ledger.assert_no_write_after_loss();
}

#[tokio::test(start_paused = true)]
async fn writes_with_an_unwatched_fence_are_only_fence_checked() {
    let store = TestStore::new();
    let guard = locker(&store, "a").acquire("ledger").await.unwrap();
    let ledger = RecordingResource::new(());
    store.evict("ledger").await;
    guard.lost().await;
    ledger.write(guard.fencing_token(), |()| ()).unwrap();
    ledger.assert_no_write_after_loss();
    assert_eq!(ledger.attempts()[0].after_loss, None);
}

/// Leases are judged on the test's clock alone: real time spent while the
/// test's clock stands still (a slow machine, a blocking call) does not
/// age them, however short the TTL.
#[tokio::test(start_paused = true)]
async fn real_time_does_not_age_a_lease_while_the_test_clock_stands() {
    let store = TestStore::new();
    let ttl = Duration::from_millis(100);
    let locker = Locker::new(store.client()).ttl(ttl);
    let guard = locker.acquire("short").await.unwrap();
    std::thread::sleep(ttl * 2);
    assert!(
        guard.is_held(),
        "a lease aged by real time on a paused clock"
    );
    // The test's clock still ends it: unrenewed, past its deadline.
    store.faults().hang_renewals();
    assert_eq!(guard.lost().await, LossReason::RenewalUnanswered);
}
