//! Leases carry the clock their send time was read on: the `Locker`'s
//! (here a host whose boot clock can jump, as after a suspend), for every
//! grant path (a free lock, a waiter made first, a permit) and for the
//! renewals that follow; and a waiter never adopts a proof of life read on
//! another waiter's clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::stores::zookeeper;
use lockcore::backend::{Clock, Moment};
use lockcore::{LockBackend, LockGuard, Locker, LossReason};

use crate::support::{connect, locker, take, unique};

/// The system clocks, with a boot clock moved ahead by what the host
/// "slept" (the monotonic clock stands still meanwhile).
#[derive(Debug, Default)]
struct SleepyHost {
    slept: Mutex<Duration>,
}

impl SleepyHost {
    fn suspend_for(&self, d: Duration) {
        *self.slept.lock().unwrap() += d;
    }
}

impl Clock for SleepyHost {
    fn now(&self) -> Moment {
        let now = Moment::now();
        let boot = now.boot().unwrap_or_default() + *self.slept.lock().unwrap();
        Moment::from_parts(now.mono(), Some(boot))
    }
}

/// A locker of `backend` whose leases are stamped and judged on `host`.
fn sleepy(backend: &lock_zookeeper::ZooKeeperBackend, host: &Arc<SleepyHost>) -> Locker {
    locker(backend).clock(host.clone())
}

/// `guard` is held with most of its TTL left, then a suspend of a TTL
/// loses it at once.
async fn judged_on(guard: &LockGuard, host: &SleepyHost, ttl: Duration, what: &str) {
    let lease = guard.lease();
    assert!(guard.is_held(), "{what}: not held right after the grant");
    assert!(
        lease.remaining() > ttl / 3,
        "{what}: {:?} of {ttl:?} left right after the grant",
        lease.remaining()
    );
    host.suspend_for(ttl);
    assert!(
        !guard.is_held(),
        "{what}: a suspend of a whole TTL must lose the lease (judged on the locker's clock)"
    );
    assert_eq!(
        guard.loss_reason(),
        Some(LossReason::DeadlinePassed),
        "{what}"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_is_stamped_and_judged_on_the_lockers_clock() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let ttl = a.session_timeout();

    // A free lock, on a host that slept before the process asked.
    let host = Arc::new(SleepyHost::default());
    host.suspend_for(Duration::from_secs(3600));
    let guard = sleepy(&a, &host)
        .acquire(unique("clock-free"))
        .await
        .unwrap();
    judged_on(&guard, &host, ttl, "try_acquire").await;

    // A waiter made first once the holder releases.
    let name = unique("clock-waiter");
    let holder = take(&b, &name).await;
    let host = Arc::new(SleepyHost::default());
    host.suspend_for(Duration::from_secs(3600));
    let waiting = tokio::spawn({
        let (locker, name) = (sleepy(&a, &host), name.clone());
        async move { locker.acquire(&name).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.release(&holder).await.unwrap();
    let guard = waiting.await.unwrap().unwrap();
    judged_on(&guard, &host, ttl, "a waiter made first").await;

    // A permit.
    let host = Arc::new(SleepyHost::default());
    let semaphore = sleepy(&a, &host)
        .semaphore(unique("clock-permits"), 2)
        .unwrap();
    let guard = semaphore.acquire().await.unwrap();
    judged_on(&guard, &host, ttl, "a permit").await;
}

/// Renewals keep a lease on its clock: held across several renewal
/// intervals, then lost to a suspend of a TTL.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_the_lease_on_its_clock() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let ttl = a.session_timeout();
    let host = Arc::new(SleepyHost::default());
    host.suspend_for(Duration::from_secs(3600));
    let guard = sleepy(&a, &host)
        .acquire(unique("clock-renewed"))
        .await
        .unwrap();
    let first = guard.lease().issued();
    tokio::time::sleep(ttl * 3 / 2).await;
    assert!(guard.is_held(), "renewals must keep the lease");
    assert!(guard.lease().issued().mono() > first.mono(), "not renewed");
    judged_on(&guard, &host, ttl, "a renewed lease").await;
}

/// Two waiters of one session on one name share one view of the queue,
/// whose listings are timed on the first waiter's clock (here a host whose
/// boot clock reads an hour ahead). The second, on a clock of its own, is
/// granted a lease judged on that clock alone: started from a reading of
/// the other clock, it would never count a suspend of its own host.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_adopts_a_proof_read_on_another_clock() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let ttl = a.session_timeout();
    let name = unique("clock-two-waiters");
    let holder = take(&b, &name).await;
    let ahead = Arc::new(SleepyHost::default());
    ahead.suspend_for(Duration::from_secs(3600));
    let first = tokio::spawn({
        let (locker, name) = (sleepy(&a, &ahead), name.clone());
        async move { locker.acquire(&name).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let host = Arc::new(SleepyHost::default());
    let second = tokio::spawn({
        let (locker, name) = (sleepy(&a, &host), name.clone());
        async move { locker.acquire(&name).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.release(&holder).await.unwrap();
    let guard = first.await.unwrap().unwrap();
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let guard = second.await.unwrap().unwrap();
    judged_on(&guard, &host, ttl, "the second waiter").await;
}
