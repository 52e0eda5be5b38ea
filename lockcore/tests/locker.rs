//! `Locker`'s own decisions, before and around the backend: which waits
//! and renew settings it accepts, how long it waits, and what the admin
//! calls evict (virtual clock).

use std::time::Duration;

use lockcore::{LockError, Locker, MemoryBackend};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(3);
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

#[tokio::test(start_paused = true)]
async fn a_wait_of_one_year_is_accepted_and_a_longer_one_refused() {
    let locker = Locker::new(MemoryBackend::new()).ttl(TTL);
    let guard = locker.acquire_timeout("year", YEAR).await.unwrap();
    guard.release().await.unwrap();
    let err = locker
        .acquire_timeout("year", YEAR + Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidTimeout { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_a_lock_released_within_its_wait_and_gives_up_after() {
    let store = MemoryBackend::new();
    let holder = Locker::new(store.clone()).ttl(TTL);
    let waiter = Locker::new(store).ttl(TTL).max_wait(Duration::from_secs(2));
    let held = holder.acquire("line").await.unwrap();
    let release = tokio::spawn(async move {
        sleep(Duration::from_millis(500)).await;
        held.release().await.unwrap();
    });
    let started = Instant::now();
    let guard = waiter.acquire("line").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500));
    release.await.unwrap();

    // Held all along: the waiter gives up at its configured wait, not before.
    let started = Instant::now();
    let err = holder.acquire("line").await.err();
    let waited = started.elapsed();
    assert!(
        matches!(err, Some(LockError::Timeout { .. })),
        "{err:?} after {waited:?}"
    );
    // The default wait: 30 s.
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "gave up after {waited:?}"
    );
    drop(guard);
}

/// One attempt on `locker`, configured for a TTL of [`TTL`].
async fn try_with(locker: Locker) -> Result<bool, LockError> {
    Ok(locker.ttl(TTL).try_acquire("n").await?.is_some())
}

#[tokio::test(start_paused = true)]
async fn a_renew_interval_must_be_positive_and_shorter_than_the_ttl_minus_drift() {
    let store = MemoryBackend::new();
    let locker = || Locker::new(store.clone());
    for every in [Duration::ZERO, TTL, TTL - Duration::from_millis(30)] {
        let err = try_with(locker().renew_every(every)).await.err();
        assert!(
            matches!(err, Some(LockError::InvalidConfig { .. })),
            "renew_every({every:?}): {err:?}"
        );
    }
    // Just under the TTL minus drift (3 s - 32 ms): accepted.
    let every = TTL - Duration::from_millis(33);
    assert!(try_with(locker().renew_every(every)).await.unwrap());
    let err = try_with(locker().max_hold(Duration::ZERO)).await.err();
    assert!(
        matches!(err, Some(LockError::InvalidConfig { .. })),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn force_release_evicts_the_holder_and_force_release_if_only_the_named_one() {
    let store = MemoryBackend::new();
    let holder = Locker::new(store.clone()).ttl(TTL);
    let admin = Locker::new(store);
    let guard = holder.acquire("n").await.unwrap();
    let fence = guard.fencing_token();
    let stale = lockcore::FencingToken::new(fence.get() + 1).unwrap();
    assert_eq!(
        admin.force_release_if("n", stale, "test").await.unwrap(),
        None,
        "another fence evicts nothing"
    );
    assert!(guard.is_held());
    let evicted = admin
        .force_release_if("n", fence, "test")
        .await
        .unwrap()
        .expect("the holder");
    assert_eq!(evicted.fence, fence);
    tokio::time::timeout(TTL, guard.lost())
        .await
        .expect("the evicted guard hears of it");
    assert!(admin.inspect("n").await.unwrap().is_none());

    let again = holder.acquire("n").await.unwrap();
    let evicted = admin
        .force_release("n", "test")
        .await
        .unwrap()
        .expect("the holder");
    assert_eq!(evicted.fence, again.fencing_token());
    assert!(!again.is_held());
    assert_eq!(admin.force_release("n", "test").await.unwrap(), None);
}

/// Each getter answers what its setter set (callers size their own waits
/// and renew loops from them), and the deprecated names answer the same.
#[test]
#[allow(deprecated)]
fn getters_answer_what_their_setters_set() {
    let label: lockcore::HolderLabel = "worker 7".parse().unwrap();
    let locker = Locker::new(MemoryBackend::new())
        .ttl(Duration::from_secs(7))
        .max_wait(Duration::from_secs(11))
        .recheck(Duration::from_millis(1_300))
        .label(label.clone());
    assert_eq!(locker.get_ttl(), Duration::from_secs(7));
    assert_eq!(locker.get_max_wait(), Duration::from_secs(11));
    assert_eq!(locker.get_recheck(), Duration::from_millis(1_300));
    assert_eq!(locker.get_label(), &label);
    assert_eq!(locker.wait_limit(), locker.get_max_wait());
    assert_eq!(locker.recheck_interval(), locker.get_recheck());
    assert_eq!(locker.holder_label(), &label);
}

#[tokio::test(start_paused = true)]
async fn a_multi_lock_refuses_no_names_a_name_twice_and_a_wait_too_long_before_any_io() {
    let store = MemoryBackend::new();
    let locker = Locker::new(store.clone()).ttl(TTL);
    let none: [&str; 0] = [];
    for err in [
        locker.acquire_all(none).await.unwrap_err(),
        locker.try_acquire_all(["a", "b", "a"]).await.unwrap_err(),
        locker.acquire_all(["a", ""]).await.unwrap_err(),
        locker
            .acquire_all_timeout(["a", "b"], YEAR + Duration::from_secs(1))
            .await
            .unwrap_err(),
    ] {
        assert!(
            matches!(
                err,
                LockError::InvalidConfig { .. }
                    | LockError::InvalidName { .. }
                    | LockError::InvalidTimeout { .. }
            ),
            "{err}"
        );
    }
    assert!(
        Locker::new(store).inspect("a").await.unwrap().is_none(),
        "a refused multi-lock took a name"
    );
}

/// One deadline for the whole: a multi-lock whose second name is held for
/// longer gives up when its wait runs out, counted from its start (not
/// again for each name), and its `Timeout` names the held one.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_waits_once_for_all_its_names() {
    let store = MemoryBackend::new();
    let holder = Locker::new(store.clone()).ttl(TTL);
    let held = holder.acquire("b").await.unwrap();
    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let err = Locker::new(store.clone())
        .ttl(TTL)
        .acquire_all_timeout(["b", "a"], wait)
        .await
        .unwrap_err();
    let waited = started.elapsed();
    match err {
        LockError::Timeout { name, waited: told } => {
            assert_eq!(name.as_str(), "b");
            assert!(
                told >= wait && told == waited,
                "told {told:?}, waited {waited:?}"
            );
        }
        other => panic!("expected Timeout, got {other}"),
    }
    assert!(
        waited < wait + Duration::from_millis(500),
        "waited {waited:?}"
    );
    assert!(holder.inspect("a").await.unwrap().is_none(), "a was kept");
    held.release().await.unwrap();
}
