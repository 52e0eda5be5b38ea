//! The fence floor's range: ZooKeeper fences are a `czxid` plus the floor's
//! offset, declared to count up to `i64::MAX` (`Capabilities::max_fence`).
//! A floor past what that leaves room for is refused before any I/O and
//! changes nothing; the largest floor accepted still lets grants happen.

mod support;

use std::time::Duration;

use lock_conformance::kit::proxy::Mode;
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::{Capabilities, FencingToken, LockBackend, LockError};
use support::{behind_proxy, connect, take, unique};
use tokio::time::Instant;

/// Floors at and past the largest accepted one are `InvalidConfig` at once,
/// through the trait and through `admin::raise_fence_floor`, even with the
/// store cut off (a request would hang); the floor node is untouched and
/// the next fence is where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_past_the_counter_is_refused_before_any_io() {
    let (proxy, backend, observer) = behind_proxy().await;
    let caps = backend.capabilities();
    assert_eq!(caps.max_fence, i64::MAX as u64);
    let largest = caps.max_fence_floor();
    assert_eq!(
        largest,
        i64::MAX as u64 - Capabilities::FENCE_FLOOR_HEADROOM
    );
    let name = unique("floor-refused");
    let before = take(&backend, &name).await;
    backend.release(&before).await.unwrap();
    let floor_node = format!("{}/%floor", backend.config().root_path());
    let floor_before = observer.check_stat(&floor_node).await.unwrap();

    proxy.set(Mode::Blackhole);
    for floor in [largest + 1, i64::MAX as u64, u64::MAX] {
        let floor = FencingToken::new(floor).unwrap();
        let started = Instant::now();
        let direct = backend.raise_fence_floor(floor).await;
        let audited = lockcore::admin::raise_fence_floor(&backend, floor).await;
        let took = started.elapsed();
        for (how, refused) in [("raise_fence_floor", direct), ("admin", audited)] {
            match refused {
                Err(e @ LockError::InvalidConfig { .. }) => {
                    assert!(e.to_string().contains(&largest.to_string()), "{how}: {e}")
                }
                other => panic!("{how}({floor}): expected InvalidConfig, got {other:?}"),
            }
        }
        assert!(
            took < scaled(Duration::from_millis(100)),
            "refusing {floor} took {took:?}: it waited for the store"
        );
    }
    proxy.set(Mode::Pass);
    assert_eq!(
        observer
            .check_stat(&floor_node)
            .await
            .unwrap()
            .map(|s| s.mzxid),
        floor_before.map(|s| s.mzxid),
        "a refused floor wrote the floor node"
    );
    let after = take(&backend, &name).await;
    assert!(
        after.fence().get() < largest / 2,
        "a refused floor moved the next fence to {}",
        after.fence()
    );
    backend.release(&after).await.unwrap();
}

/// On a private server: raising the floor to the largest accepted value,
/// locks (a used and a fresh name) and permits are still granted, with
/// fences above the floor, within `max_fence`, and growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_floor_accepted_still_lets_grants_happen() {
    if !support::may_launch_servers("the_largest_floor_accepted_still_lets_grants_happen") {
        return;
    }
    let store = tokio::task::spawn_blocking(|| zookeeper::start(zookeeper::Options::default()))
        .await
        .unwrap()
        .unwrap();
    let (a, admin) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let caps = a.capabilities();
    let largest = FencingToken::new(caps.max_fence_floor()).unwrap();
    let (used, fresh, permits) = (
        unique("floor-max"),
        unique("floor-max-fresh"),
        unique("floor-max-permits"),
    );
    let earlier = take(&a, &used).await;
    a.release(&earlier).await.unwrap();
    admin.raise_fence_floor(largest).await.unwrap();
    let mut last = largest;
    for round in 0..3 {
        for name in [&used, &fresh] {
            let lease = take(&a, name).await;
            a.release(&lease).await.unwrap();
            assert!(
                lease.fence() > last && lease.fence().get() <= caps.max_fence,
                "round {round}: {name} granted fence {} after {last} (floor {largest}, max {})",
                lease.fence(),
                caps.max_fence
            );
            last = lease.fence();
        }
        let request = LockRequest::new(permits.clone(), earlier.ttl());
        let permit = a
            .try_acquire_permit(&request, 2)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        a.release(&permit).await.unwrap();
        assert!(permit.fence() > largest && permit.fence().get() <= caps.max_fence);
    }
    eprintln!("fences after the largest floor {largest}: up to {last}");
}
