//! Clocks: a lease row expires on the host's boot clock of its boot (a row
//! of an earlier boot is expired), and every lease is stamped on the clock
//! of the request that granted it, its renewals on the lease's own clock,
//! read before the request leaves.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::{Clock, LockBackendExt, LockRequest, Moment};
use lockcore::{Attempt, LockBackend};
use sqlx::Connection;

use crate::support::{self, name};

#[tokio::test]
async fn a_row_of_an_earlier_boot_is_expired() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let a = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    let n = name("rebooted");
    let old = a
        .try_acquire_for(&n, Duration::from_secs(3600))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    // The holder "died with its boot": its row names another boot id (and
    // its process, this one, no longer counts: close it).
    a.close().await.unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&support::url(&path))
        .await
        .unwrap();
    sqlx::query("UPDATE distlock_leases SET boot_id = 'an-earlier-boot', presence_dev = NULL")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let b = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    assert!(b.inspect(&n).await.unwrap().is_none());
    let next = b
        .try_acquire_for(&n, Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .expect("a row of an earlier boot is free");
    assert!(next.fence() > old.fence());
}

#[tokio::test]
async fn leases_are_stamped_and_judged_on_their_own_clock() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(60);
    let clock = Arc::new(Ahead::default());
    clock.jump(Duration::from_secs(1_000));
    let request = LockRequest::new(
        name("clocked"),
        backend.capabilities().effective_ttl(ttl).unwrap(),
    )
    .with_clock(clock.clone());

    let before = clock.now();
    let lease = backend
        .try_acquire(&request)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    assert!(
        Arc::ptr_eq(lease.clock(), &dyn_clock),
        "the lease is judged on another clock than its request's"
    );
    assert!(
        lease.issued().boot() >= before.boot() && lease.issued().mono() >= before.mono(),
        "the grant was stamped {:?}, before the request's clock read {:?}",
        lease.issued(),
        before
    );
    // The host sleeps half the TTL: the lease counts it.
    clock.jump(ttl / 2);
    assert!(lease.remaining() <= ttl / 2, "{:?} left", lease.remaining());

    // A renewal is stamped on the lease's clock, read before it is sent.
    let before = clock.now();
    let renewed = backend.renew(&lease).await.unwrap();
    assert!(
        renewed.issued().boot() >= before.boot(),
        "the renewal was stamped {:?}, before the lease's clock read {:?}",
        renewed.issued(),
        before
    );
    assert!(Arc::ptr_eq(renewed.clock(), &dyn_clock));
    assert!(renewed.remaining() > ttl / 2 && renewed.remaining() <= ttl);
    backend.release(&renewed).await.unwrap();
    backend.close().await.unwrap();
}

/// A batch reads each clock once, but stamps each renewal on its own
/// lease's clock: a lease on a clock ahead of the system's, renewed in one
/// batch after a lease on the system clock, is renewed as of its own clock.
#[tokio::test]
async fn a_batch_stamps_each_renewal_on_its_own_leases_clock() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(60))
        .unwrap();
    let ahead = Arc::new(Ahead::default());
    ahead.jump(Duration::from_secs(1_000));
    let mut leases = Vec::new();
    for request in [
        LockRequest::new(name("system"), ttl),
        LockRequest::new(name("ahead"), ttl).with_clock(ahead.clone()),
    ] {
        leases.push(
            backend
                .try_acquire(&request)
                .await
                .unwrap()
                .into_lease()
                .unwrap(),
        );
    }
    let before = ahead.now();
    let renewed = backend.renew_many(&leases).await;
    let on_ahead = renewed[1].as_ref().unwrap();
    assert!(
        on_ahead.issued().boot() >= before.boot(),
        "renewed as of {:?}, before its own clock read {:?}",
        on_ahead.issued(),
        before
    );
    for lease in renewed {
        backend.release(&lease.unwrap()).await.unwrap();
    }
    backend.close().await.unwrap();
}

#[tokio::test]
async fn a_request_on_the_system_clock_keeps_it() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let lease = backend
        .try_acquire_for(&name("plain"), Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(lease.remaining() > Duration::from_secs(58));
    backend.release(&lease).await.unwrap();
    backend.close().await.unwrap();
}

/// The system clocks, with the boot clock `ahead` of the real one (a host
/// that was suspended for that long, as this clock's reader sees it).
#[derive(Debug, Default)]
struct Ahead {
    ahead: Mutex<Duration>,
}

impl Ahead {
    fn jump(&self, d: Duration) {
        *self.ahead.lock().unwrap() += d;
    }
}

impl Clock for Ahead {
    fn now(&self) -> Moment {
        let real = Moment::now();
        let ahead = *self.ahead.lock().unwrap();
        Moment::from_parts(real.mono(), real.boot().map(|b| b + ahead))
    }
}

/// What `inspect` shows of a holder's time left, and what a refused
/// attempt reports of it (so a waiter can come back then), is its row's
/// expiry less the host's boot clock now: at most the TTL, and at least
/// the TTL less the boot-clock time from before the grant to after the
/// look.
#[tokio::test]
async fn inspect_and_a_refusal_show_the_time_left_on_the_host_boot_clock() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    let backend = SqliteBackend::connect(&url).await.unwrap();
    let other = SqliteBackend::connect(&url).await.unwrap();
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(60))
        .unwrap()
        .get();
    let n = name("time-left");
    let before = Moment::now().boot().unwrap();
    let lease = backend
        .try_acquire_for(&n, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let holder = backend.inspect(&n).await.unwrap().expect("held");
    let refused = other.try_acquire_for(&n, ttl).await.unwrap();
    let took = Moment::now().boot().unwrap() - before;
    let Attempt::Held { expires_in } = refused else {
        panic!("a held lock was granted again");
    };
    for (what, left) in [("inspect", holder.expires_in), ("a refusal", expires_in)] {
        let left = left.expect("a lock file knows its rows' expiry");
        assert!(
            left <= ttl && left >= ttl.saturating_sub(took),
            "{what}: {left:?} left of a {ttl:?} TTL, {took:?} after the request"
        );
    }
    backend.release(&lease).await.unwrap();
    backend.close().await.unwrap();
    other.close().await.unwrap();
}
