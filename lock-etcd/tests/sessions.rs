//! Locks share one session lease per client and TTL: what that must not
//! change. A lock nobody renews still expires on its own TTL while the
//! client renews others on the same session; the end of a session reaches
//! every guard on it at once.

mod support;

use std::time::Duration;

use lock_conformance::kit::stores::etcd;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{LockBackend, Locker, LossReason};
use support::*;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lock_expires_on_its_own_ttl_while_its_session_lives_on() {
    let url = etcd::shared().endpoint();
    let (client, observer) = (connect(&url).await, connect(&url).await);
    let ttl = Duration::from_secs(1);
    // One lock the client keeps renewing (refreshing the shared session)...
    let locker = Locker::new(client.clone()).ttl(ttl);
    let renewed = locker.acquire(name("renewed")).await.unwrap();
    // ...and one on the same session that nobody renews.
    let abandoned_name = name("abandoned");
    let abandoned = acquire(&client, &abandoned_name, ttl).await;
    assert_eq!(client.sessions(), 1, "both locks on one session");
    let caps = client.capabilities();
    let within = ttl + caps.slack_for(ttl) + scaled(Duration::from_millis(500));
    let wait = WaitPolicy::new(abandoned.issued().mono() + within)
        .recheck(scaled(Duration::from_millis(100)));
    let next = observer
        .acquire_for(&abandoned_name, ttl, &wait)
        .await
        .unwrap()
        .unwrap_or_else(|| {
            panic!("L1: a lock nobody renews was not free within TTL + slack ({within:?})")
        });
    let freed = Instant::now();
    assert!(
        freed >= abandoned.deadline(),
        "S3: freed {:?} before its holder's local deadline",
        abandoned.deadline() - freed
    );
    assert!(next.fence() > abandoned.fence());
    eprintln!(
        "unrenewed lock free {:?} after it was granted (TTL {ttl:?})",
        freed - abandoned.issued().mono()
    );
    // The renewed lock lived on throughout.
    tokio::time::sleep(ttl).await;
    assert!(
        renewed.is_held(),
        "the renewed lock on the same session was lost"
    );
    assert!(matches!(
        client.renew(&abandoned).await,
        Err(lockcore::LockError::NotHeld { .. })
    ));
    renewed.release().await.unwrap();
    observer.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_session_reaches_every_guard_on_it_at_once() {
    let url = etcd::shared().endpoint();
    let client = connect(&url).await;
    let mut raw = raw(&url).await;
    // Renewals every 4 s: only the store-pushed signal can be fast.
    let locker = Locker::new(client.clone())
        .ttl(Duration::from_secs(12))
        .renew_every(Duration::from_secs(4));
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(
            locker
                .acquire(name(&format!("session-end-{i}")))
                .await
                .unwrap(),
        );
    }
    let key = client.key_of(&guards[0].lease()).unwrap();
    let session = etcd_lease_of(&mut raw, &key).await;
    for guard in &guards[1..] {
        let key = client.key_of(&guard.lease()).unwrap();
        assert_eq!(etcd_lease_of(&mut raw, &key).await, session, "one session");
    }
    let revoked = Instant::now();
    raw.lease_revoke(session).await.unwrap();
    for guard in &guards {
        let reason = tokio::time::timeout(scaled(Duration::from_secs(2)), guard.lost())
            .await
            .expect("lost() must fire well before the next renewal (4 s)");
        assert_eq!(reason, LossReason::StoreReported);
        assert!(!guard.is_held());
    }
    eprintln!("3 guards lost {:?} after the revoke", revoked.elapsed());
    // The next lock gets a new session.
    let next = locker.acquire(name("after-session-end")).await.unwrap();
    let key = client.key_of(&next.lease()).unwrap();
    assert_ne!(etcd_lease_of(&mut raw, &key).await, session);
    next.release().await.unwrap();
}

/// The keeper drops a session nothing is attached to after a few idle
/// seconds, revoking its lease. A lock being written to it at that moment
/// must keep it alive: here the put is on its way (a slow link) when the
/// session turns idle, and lands before the revoke would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_not_dropped_while_a_lock_is_on_its_way_to_it() {
    use lock_conformance::kit::proxy::{FaultProxy, Mode};
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = connect(&store.endpoint_via(proxy.addr())).await;
    let observer = connect(&store.endpoint()).await;
    let ttl = Duration::from_secs(30);
    let lock = name("on-its-way");
    let first = acquire(&client, &lock, ttl).await;
    client.release(&first).await.unwrap();
    let released = Instant::now();
    // Idle from now; the keeper drops the session 5 s later. The next put
    // leaves before that and lands after it.
    proxy.set(Mode::Delay {
        base: Duration::from_secs(1),
        jitter: Duration::ZERO,
    });
    tokio::time::sleep_until(released + Duration::from_millis(4_500)).await;
    let held = acquire(&client, &lock, ttl).await;
    proxy.set(Mode::Pass);
    // Whatever the keeper did meanwhile, the lock is the client's.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = observer.inspect(&lock).await.unwrap();
    assert_eq!(
        seen.map(|h| h.fence),
        Some(held.fence()),
        "S1: the lock the client holds is gone from etcd"
    );
    assert!(matches!(
        observer.try_acquire_for(&lock, ttl).await.unwrap(),
        lockcore::Attempt::Held { .. }
    ));
    client.renew(&held).await.expect("still held");
    client.release(&held).await.unwrap();
}
