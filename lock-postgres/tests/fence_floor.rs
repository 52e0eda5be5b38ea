//! The fence floor's bounds: the sequence is a bigint, so a floor that
//! leaves it no room to count (within `Capabilities::FENCE_FLOOR_HEADROOM`
//! of `i64::MAX`) is refused with `InvalidConfig` before any I/O and changes
//! nothing; the largest floor accepted still lets every kind of grant
//! happen.

mod support;

use std::time::Duration;

use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::PostgresBackend;
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::{Capabilities, FencingToken, LockBackend, LockError};
use support::{acquired, backend, lock_name, scaled, shared_url};
use tokio::time::Instant;

#[tokio::test]
async fn a_floor_past_the_counter_is_refused_before_any_io() {
    let store = postgres::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let op_timeout = scaled(Duration::from_secs(2));
    let url = format!(
        "{}?lock_op_timeout_ms={}",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let client = PostgresBackend::connect(&url).await.unwrap();
    let caps = client.capabilities();
    assert_eq!(caps.max_fence, i64::MAX.unsigned_abs(), "a bigint sequence");
    let largest = caps.max_fence_floor();
    assert_eq!(largest, caps.max_fence - Capabilities::FENCE_FLOOR_HEADROOM);
    // Any I/O would now hang until the operation timeout.
    proxy.set(Mode::Blackhole);
    for floor in [largest + 1, i64::MAX.unsigned_abs(), u64::MAX] {
        let floor = FencingToken::new(floor).unwrap();
        let started = Instant::now();
        let refused = client.raise_fence_floor(floor).await;
        let audited = lockcore::admin::raise_fence_floor(&client, floor).await;
        for outcome in [&refused, &audited] {
            assert!(
                matches!(outcome, Err(LockError::InvalidConfig { .. })),
                "floor {floor}: {outcome:?}"
            );
        }
        assert!(
            started.elapsed() < op_timeout / 2,
            "floor {floor} refused after {:?}: it went to the server",
            started.elapsed()
        );
    }
    proxy.set(Mode::Pass);
    let next = acquired(
        &backend(&shared_url()).await,
        &lock_name("unmoved"),
        Duration::from_secs(5),
    )
    .await;
    assert!(
        next.fence().get() < largest / 2,
        "a refused floor moved the next fence to {}",
        next.fence()
    );
}

/// On a server of its own (the floor moves its one sequence for good).
#[tokio::test]
async fn the_largest_floor_accepted_still_grants() {
    let store = postgres::start(Options::default()).expect("private postgres");
    let client = backend(&store.url()).await;
    let floor = FencingToken::new(client.capabilities().max_fence_floor()).unwrap();
    client.raise_fence_floor(floor).await.unwrap();
    let ttl = client
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    let mut last = floor;
    for i in 0..3 {
        let lock = acquired(&client, &lock_name(&format!("top-{i}")), ttl.get()).await;
        let permit = client
            .try_acquire_permit(&LockRequest::new(lock_name(&format!("slot-{i}")), ttl), 2)
            .await
            .unwrap()
            .into_lease()
            .expect("a free permit");
        for lease in [&lock, &permit] {
            assert!(lease.fence() > last, "{} after {last}", lease.fence());
            last = lease.fence();
            client.renew(lease).await.unwrap();
            client.release(lease).await.unwrap();
        }
    }
}
