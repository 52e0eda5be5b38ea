//! The store-pushed loss signal: a lease dropped by etcd or a forced
//! release reaches a connected holder's guard at once, not at its next
//! renewal.

use std::time::Duration;

use lock_conformance::kit::stores::etcd;
use lock_etcd::testing::key_of;
use lockcore::{LockBackend, Locker, LossReason, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_etcd_drops_the_lease_not_at_the_next_renewal() {
    let url = etcd::shared().endpoint();
    let backend = connect(&url).await;
    let mut client = raw(&url).await;
    // Renewals every 4 s: only the store-pushed signal can be fast.
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(12))
        .renew_every(Duration::from_secs(4));

    // 1. The lease is revoked behind our back (an operator, or etcd expiring it).
    let guard = locker.acquire(name("revoked")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // the watch opens after ttl/10, <= 250 ms
    let key = key_of(&guard.lease()).unwrap();
    let id = etcd_lease_of(&mut client, &key).await;
    let revoked = Instant::now();
    client.lease_revoke(id).await.unwrap();
    let reason = tokio::time::timeout(scaled(Duration::from_secs(2)), guard.lost())
        .await
        .expect("lost() must fire well before the next renewal (4 s)");
    assert_eq!(reason, LossReason::StoreReported);
    assert!(!guard.is_held());
    assert!(revoked.elapsed() < scaled(Duration::from_secs(2)));
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);

    // 2. A forced release.
    let lock = name("forced");
    let guard = locker.acquire(&lock).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    backend.evict(&lock, None).await.unwrap();
    let reason = tokio::time::timeout(scaled(Duration::from_secs(2)), guard.lost())
        .await
        .expect("lost() must fire at once on a forced release");
    assert_eq!(reason, LossReason::StoreReported);
    drop(guard);

    // 3. A plain release is not a loss.
    let guard = locker.acquire(name("released")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lost = guard.lost_token();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !lost.is_cancelled(),
        "our own release must not fire the loss signal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_reach_a_connected_holder_within_the_declared_notice() {
    let url = etcd::shared().endpoint();
    let (holder, admin) = (connect(&url).await, connect(&url).await);
    let notice = holder
        .capabilities()
        .eviction_notice
        .expect("etcd pushes evictions to the holder's watch: the notice must be declared");
    let bound = notice + round_trip(&holder).await;
    // Renewals every 4 s: only the pushed notice can be on time.
    let locker = Locker::new(holder.clone())
        .ttl(Duration::from_secs(5))
        .renew_every(Duration::from_secs(4));
    let mut took = Vec::new();
    for run in 0..25 {
        let lock = name("evicted");
        let guard = locker.acquire(&lock).await.unwrap();
        // Before and after the holder's watch starts (up to 300 ms in).
        tokio::time::sleep(Duration::from_millis(25 * run)).await;
        let fence = guard.fencing_token();
        let evicted = admin.evict(&lock, Some(fence)).await.unwrap();
        assert_eq!(evicted.map(|h| h.fence), Some(fence));
        let sent = Instant::now();
        let reason = tokio::time::timeout(bound, guard.lost())
            .await
            .unwrap_or_else(|_| {
                panic!("run {run}: lost() did not fire within {bound:?} of the eviction")
            });
        took.push(sent.elapsed());
        assert_eq!(reason, LossReason::StoreReported);
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
    }
    took.sort();
    eprintln!(
        "eviction notice: n={} min={:?} median={:?} max={:?} (declared {notice:?}, bound {bound:?})",
        took.len(),
        took[0],
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

/// An entry no distlock session wrote (another writer's key in the queue,
/// on an etcd lease of its own) is evicted like any holder, and no notice
/// is left under that lease: no session of ours follows it, so nobody
/// would read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_another_writers_entry_leaves_no_notice() {
    use lock_etcd::etcd_client::{GetOptions, PutOptions};
    let url = etcd::shared().endpoint();
    let backend = connect(&url).await;
    let mut raw = raw(&url).await;
    let lock = name("foreign");
    let ours = acquire(&backend, &lock, Duration::from_secs(10)).await;
    let value = raw.get(key_of(&ours).unwrap(), None).await.unwrap().kvs()[0]
        .value()
        .to_vec();
    backend.release(&ours).await.unwrap();
    let theirs = raw.lease_grant(60, None).await.unwrap().id();
    let foreign = [queue_of(&ours).as_slice(), b"foreign"].concat();
    raw.put(
        foreign.clone(),
        value,
        Some(PutOptions::new().with_lease(theirs)),
    )
    .await
    .unwrap();
    let evicted = backend.evict(&lock, None).await.unwrap();
    assert!(evicted.is_some(), "the foreign entry was the holder");
    assert!(raw.get(foreign, None).await.unwrap().kvs().is_empty());
    let notices = format!("distlock//sessions/{:016x}/", theirs);
    let left = raw
        .get(notices.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(left.kvs().is_empty(), "a notice left under {notices}");
    raw.lease_revoke(theirs).await.unwrap();
}
