//! The restore procedure (docs/operations.md §5) with clients running: a
//! holder that keeps renewing and a waiter in line stay up while the server
//! is restored from an older AOF copy. The clients reach the server through
//! a network (a fault proxy) that the operator closes for the restore; the
//! operator reaches it directly.

use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::redis::Options;
use lock_conformance::kit::until;
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{FencedResource, FencingToken, LockBackend, LockGuard, Locker, LossReason};
use tokio::time::Instant;

/// Fences run ahead of the server clock (an earlier restore raised the
/// floor an hour ahead), so the clock floor of every fence cannot hide the
/// counter going back. Fences handed out after the backup was taken are
/// in use when it is restored: the holder's, renewed all along. Following
/// the procedure (clients kept away for the longest TTL, the floor raised to
/// the highest fence in use before traffic reopens), the holder counts its
/// lease lost before anyone can be granted the name, the waiter is granted
/// it after the restore with a fence above every fence before, and the
/// holder's late write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_under_running_clients_repeats_no_fence_and_makes_no_second_holder() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let aof = store.data_dir().unwrap().join("appendonlydir");
    let backup = store.data_dir().unwrap().join("backup");
    let operator = connect_scaled(&url).await;
    let ahead = server_micros(&mut raw(&url).await).await + 3_600_000_000;
    operator
        .raise_fence_floor(FencingToken::new(ahead).unwrap())
        .await
        .unwrap();

    let network = FaultProxy::start(store.addr()).await.unwrap();
    let ttl = scaled(Duration::from_secs(2));
    let app = async || {
        let config = RedisConfig::from_url(&url)
            .unwrap()
            .address(network.addr().ip().to_string(), network.addr().port());
        Locker::new(RedisBackend::connect_with(config).await.unwrap())
            .ttl(ttl)
            .max_wait(LONG)
    };
    let (holder, waiter) = (app().await, app().await);
    let lock = unique("restored-live");
    let resource = FencedResource::new(0_u32);
    let write = |guard: &LockGuard| resource.write(guard.fencing_token(), |n| *n += 1);
    let cycle = async || {
        let guard = holder.acquire(&lock).await.unwrap();
        write(&guard).unwrap();
        guard.release().await.unwrap();
    };

    cycle().await;
    copy_dir(&aof, &backup);
    for _ in 0..3 {
        cycle().await;
    }
    let held = holder.acquire(&lock).await.unwrap();
    write(&held).unwrap();
    let granted = held.lease().issued();
    until(ttl, "the holder's first renewal", || async {
        held.lease().issued() != granted
    })
    .await;
    let waiting = tokio::spawn({
        let (waiter, lock) = (waiter.clone(), lock.clone());
        async move { waiter.acquire(&lock).await }
    });
    in_line(&raw(&url).await, &lock, 1).await;

    // 1. The highest fence in use.
    let highest = operator.inspect(&lock).await.unwrap().unwrap().fence;
    assert_eq!(highest, held.fencing_token());
    // 2. Restore, with clients kept away for at least the longest TTL.
    network.set(Mode::Blackhole);
    let cut = Instant::now();
    store.kill_now().unwrap();
    copy_dir(&backup, &aof);
    store.restart_now().unwrap();
    let operator = connect_scaled(&url).await;
    assert_eq!(
        operator.inspect(&lock).await.unwrap(),
        None,
        "the backup predates the grant"
    );
    // 3. Raise the floor to the highest fence in use.
    operator.raise_fence_floor(highest).await.unwrap();
    tokio::time::sleep_until(cut + ttl).await;
    assert!(
        !held.is_held(),
        "the holder still reads held a TTL after the store stopped answering"
    );
    // 4. Reopen traffic.
    let reopened = Instant::now();
    network.set(Mode::Pass);

    let next = tokio::time::timeout(LONG, waiting)
        .await
        .expect("the waiter is granted the name after the restore")
        .unwrap()
        .unwrap();
    assert!(
        !held.is_held(),
        "two holders: the old holder reads held while the waiter is granted the name"
    );
    assert!(reopened.elapsed() < LONG);
    assert!(
        next.fencing_token() > highest,
        "fence {} after the restore, {highest} in use before it",
        next.fencing_token()
    );
    write(&next).unwrap();
    assert!(
        write(&held).is_err(),
        "the old holder's late write must be refused"
    );
    assert!(
        matches!(held.loss_reason(), Some(reason) if reason != LossReason::Closed),
        "{:?}",
        held.loss_reason()
    );
    let fences = resource.accepted();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "every grant wrote with a larger fence than the one before: {fences:?}"
    );
    assert_eq!(fences.len(), 6);
    next.release().await.unwrap();
}
