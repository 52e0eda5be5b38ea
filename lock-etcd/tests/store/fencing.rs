//! Resource-side fencing and compare-and-evict, against the harness's etcd.

use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::stores::etcd;
use lock_etcd::EtcdBackend;
use lock_etcd::etcd_client::{Txn, TxnOp};
use lock_etcd::testing::key_of;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Lease, LockBackend, LockError};
use tokio::time::Instant;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_compare_lets_writes_into_etcd_through_only_while_held() {
    let url = etcd::shared().endpoint();
    let (holder, admin) = (connect(&url).await, connect(&url).await);
    let lock = name("fenced");
    let resource = format!("etcd-test/resource/{:08x}", rand_u32());
    let write = |backend: &EtcdBackend, lease: &Lease, value: &str| {
        let txn = Txn::new()
            .when([backend.fence_compare(lease)])
            .and_then([TxnOp::put(resource.clone(), value, None)]);
        let mut client = backend.client().unwrap();
        async move { client.txn(txn).await.unwrap().succeeded() }
    };
    let lease = acquire(&holder, &lock, Duration::from_secs(10)).await;
    assert!(
        write(&holder, &lease, "first").await,
        "the holder's write applies"
    );
    admin.evict(&lock, None).await.unwrap();
    assert!(
        !write(&holder, &lease, "zombie").await,
        "the evicted holder's write is refused"
    );
    let next = acquire(&admin, &lock, Duration::from_secs(10)).await;
    assert!(write(&admin, &next, "second").await);
    assert!(
        !write(&holder, &lease, "zombie").await,
        "still refused under the new holder"
    );
    let forged = Lease::new(
        lock.clone(),
        next.owner(),
        next.fence(),
        next.ttl(),
        lockcore::backend::Moment::now(),
    );
    assert!(
        !write(&holder, &forged, "forged").await,
        "a lease we did not grant never matches"
    );
    let mut client = raw(&url).await;
    let value = client.get(resource.clone(), None).await.unwrap();
    assert_eq!(value.kvs()[0].value_str().unwrap(), "second");
    admin.release(&next).await.unwrap();
    assert!(!write(&admin, &next, "late").await, "refused after release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_evict_evicts_only_the_fence_it_names() {
    let url = etcd::shared().endpoint();
    let (holder, waiter, admin) = (
        connect(&url).await,
        connect(&url).await,
        connect(&url).await,
    );
    let lock = name("compare-and-evict");
    assert_eq!(
        admin.evict(&lock, None).await.unwrap(),
        None,
        "nothing to evict"
    );
    let held = acquire(&holder, &lock, Duration::from_secs(10)).await;
    let fence = held.fence();
    let other = |delta: i64| lockcore::FencingToken::new(fence.get().saturating_add_signed(delta));
    for wrong in [other(1), other(-1)] {
        let wrong = wrong.unwrap();
        assert_eq!(
            admin.evict(&lock, Some(wrong)).await.unwrap(),
            None,
            "{wrong}"
        );
    }
    assert_eq!(admin.inspect(&lock).await.unwrap().unwrap().fence, fence);
    let held = holder
        .renew(&held)
        .await
        .expect("a wrong fence evicted nothing");

    // A waiter in line: the eviction hands it the lock.
    let waiting = {
        let (waiter, lock) = (waiter.clone(), lock.clone());
        tokio::spawn(async move {
            let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(20));
            waiter
                .acquire_for(&lock, Duration::from_secs(10), &wait)
                .await
        })
    };
    let key = key_of(&held).unwrap();
    let queue = queue_of(&held);
    let mut client = raw(&url).await;
    until(Duration::from_secs(10), "the waiter in line", || {
        let (mut client, queue) = (client.clone(), queue.clone());
        async move { queue_len(&mut client, queue).await == 2 }
    })
    .await;
    let evicted = admin.evict(&lock, Some(fence)).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(fence));
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is granted after the eviction")
        .unwrap()
        .unwrap()
        .expect("granted");
    assert!(next.fence() > fence);
    // The admin's retry (say its reply was lost) names the old fence: the
    // next holder keeps the lock.
    assert_eq!(admin.evict(&lock, Some(fence)).await.unwrap(), None);
    assert_eq!(
        admin.inspect(&lock).await.unwrap().unwrap().fence,
        next.fence()
    );
    assert!(matches!(
        holder.renew(&held).await,
        Err(LockError::NotHeld { .. })
    ));
    waiter
        .renew(&next)
        .await
        .expect("the next holder still holds");
    let value = client.get(key, None).await.unwrap();
    assert!(value.kvs().is_empty(), "the evicted grant's key is gone");
    waiter.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_refuses_a_token_older_than_the_last_one_applied() {
    let url = etcd::shared().endpoint();
    let (old_holder, new_holder) = (connect(&url).await, connect(&url).await);
    let lock = name("fenced-write");
    let resource = format!("etcd-test/orders/{:08x}", rand_u32());
    let fence_key = format!("{resource}/fence");
    let write = |backend: &EtcdBackend, token, value: &'static str| {
        let (backend, fence_key, resource) = (backend.clone(), fence_key.clone(), resource.clone());
        async move {
            backend
                .fenced_write(fence_key, token, [TxnOp::put(resource, value, None)])
                .await
                .unwrap()
        }
    };
    let old = acquire(&old_holder, &lock, Duration::from_secs(10)).await;
    assert!(
        write(&old_holder, old.fence(), "first").await.is_ok(),
        "the first write applies"
    );
    assert!(
        write(&old_holder, old.fence(), "again").await.is_ok(),
        "the same holder writes again"
    );
    // The old holder is paused past its lease; a new holder takes over and writes.
    old_holder.evict(&lock, Some(old.fence())).await.unwrap();
    let new = acquire(&new_holder, &lock, Duration::from_secs(10)).await;
    assert!(write(&new_holder, new.fence(), "second").await.is_ok());
    let refused = write(&old_holder, old.fence(), "zombie").await.unwrap_err();
    assert_eq!((refused.token, refused.highest), (old.fence(), new.fence()));
    let mut client = raw(&url).await;
    let value = client.get(resource.clone(), None).await.unwrap();
    assert_eq!(
        value.kvs()[0].value_str().unwrap(),
        "second",
        "the refused write wrote nothing"
    );
    // Fences above 10^19 compare as numbers too (fixed-width digits).
    let huge = lockcore::FencingToken::new(u64::MAX).unwrap();
    assert!(write(&new_holder, huge, "huge").await.is_ok());
    assert!(write(&new_holder, new.fence(), "late").await.is_err());
    new_holder.release(&new).await.unwrap();
}
