//! Restoring etcd from an older snapshot moves revisions, and so fences,
//! back; the procedure (raise the fence floor to the highest fence seen
//! before reopening) makes every fence handed out afterwards larger again,
//! for every name, permit and waiter already in line.

mod support;

use std::time::Duration;

use lock_conformance::stores::{etcd, until};
use lock_etcd::EtcdBackend;
use lockcore::backend::{LockBackendExt, LockRequest, WaitPolicy};
use lockcore::{FencingToken, LockBackend, LockName};
use support::*;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

/// A few acquire/release cycles of `lock`; the last fence.
async fn cycles(backend: &EtcdBackend, lock: &LockName, n: usize) -> FencingToken {
    let mut last = None;
    for _ in 0..n {
        let lease = acquire(backend, lock, TTL).await;
        last = Some(lease.fence());
        backend.release(&lease).await.unwrap();
    }
    last.expect("at least one cycle")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_fences_go_back_until_the_floor_is_raised() {
    let store = private_etcd().await;
    let backup = tempfile::tempdir().unwrap();
    let snapshot = backup.path().join("snapshot.db");
    let lock = name("restored");
    {
        let before = connect(&store.endpoint()).await;
        cycles(&before, &lock, 3).await;
        let (store, snapshot) = (&store, snapshot.clone());
        tokio::task::block_in_place(|| etcd::snapshot(store, &snapshot))
            .expect("etcdctl snapshot save");
    }
    // History the restore will lose: the resource saw these fences.
    let highest = {
        let lost = connect(&store.endpoint()).await;
        cycles(&lost, &lock, 5).await
    };
    tokio::task::block_in_place(|| etcd::restore(&store, &snapshot))
        .expect("etcdctl snapshot restore");

    // Without the procedure, the next fence goes back: the resource would
    // refuse it, or worse, take it for a new holder's if it forgot.
    let client = connect(&store.endpoint()).await;
    let back = cycles(&client, &lock, 1).await;
    assert!(
        back <= highest,
        "the restore did not move fences back ({back} after {highest}): the test shows nothing"
    );

    // A waiter already in line when the floor is raised.
    let (holder, waiter) = (
        connect(&store.endpoint()).await,
        connect(&store.endpoint()).await,
    );
    let queued = name("queued");
    let held = acquire(&holder, &queued, TTL).await;
    let waiting = {
        let (waiter, queued) = (waiter.clone(), queued.clone());
        tokio::spawn(async move {
            let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(30));
            waiter.acquire_for(&queued, TTL, &wait).await
        })
    };
    let queue = queue_of(&holder, &held);
    let raw = raw(&store.endpoint()).await;
    until(
        scaled(Duration::from_secs(10)),
        "the waiter in line",
        || {
            let (mut raw, queue) = (raw.clone(), queue.clone());
            async move { queue_len(&mut raw, queue).await == 2 }
        },
    )
    .await;

    // The procedure: raise the floor to the highest fence seen.
    client.raise_fence_floor(highest).await.unwrap();
    let again = cycles(&client, &lock, 1).await;
    let fresh = cycles(&client, &name("never-used"), 1).await;
    let ttl = client.capabilities().effective_ttl(TTL).unwrap();
    let permit = client
        .try_acquire_permit(&LockRequest::new(name("permits"), ttl), 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    client.release(&permit).await.unwrap();
    holder.release(&held).await.unwrap();
    let waited = tokio::time::timeout(scaled(Duration::from_secs(10)), waiting)
        .await
        .expect("the waiter is served")
        .unwrap()
        .unwrap()
        .expect("granted");
    for (what, fence) in [
        ("the restored name", again),
        ("a never-used name", fresh),
        ("a permit", permit.fence()),
        ("a waiter queued before the raise", waited.fence()),
    ] {
        assert!(
            fence > highest,
            "{what}: fence {fence}, not above the floor {highest}"
        );
    }
    let seen = waiter.inspect(&queued).await.unwrap().expect("held");
    assert_eq!(seen.fence, waited.fence(), "inspect agrees with the holder");
    waiter.release(&waited).await.unwrap();
    // Raising it lower again moves nothing back.
    client.raise_fence_floor(back).await.unwrap();
    assert!(cycles(&client, &lock, 1).await > again);
}
