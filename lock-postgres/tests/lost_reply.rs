//! An acquire whose reply is lost may have taken the lock for an owner who
//! will never use it. The backend removes such a phantom in the background
//! (owner-checked) once the store answers again, instead of leaving the
//! name blocked for the whole TTL.

use std::time::Duration;

use lock_conformance::proxy::{FaultProxy, Mode};
use lock_conformance::stores::{eventually, postgres, until};
use lock_postgres::PostgresBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockName, ReleaseOutcome};
use tokio::time::Instant;

fn scale() -> f64 {
    std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0)
}

fn lock_name(s: &str) -> LockName {
    LockName::new(format!(
        "lost-reply/{}/{s}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ))
    .unwrap()
}

/// Opens a pooled connection and prepares the acquire statement on it, so
/// a later acquire is sent in one go (sqlx would otherwise wait for the
/// reply to its Parse first, and a lost reply would mean nothing ran).
/// Then waits until the backend's background work on its single pooled
/// connection is over (its first grant starts the eviction LISTEN, and a
/// check of that grant), so nothing else is in flight when replies drop.
async fn warm_up(client: &PostgresBackend) {
    let name = lock_name("warm-up");
    let lease = match client.try_acquire_for(&name, Duration::from_secs(5)).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the free lock: {other:?}"),
    };
    until(Duration::from_secs(10), "the eviction LISTEN", || async {
        format!("{client:?}").contains("listening_for_evictions: true")
    })
    .await;
    client.release(&lease).await.unwrap();
    // Again, on the one connection (the check is over once it is free):
    // the acquire statement is prepared on it.
    match client.try_acquire_for(&name, Duration::from_secs(5)).await {
        Ok(Attempt::Acquired(lease)) => client.release(&lease).await.unwrap(),
        other => panic!("the free lock: {other:?}"),
    };
    // sqlx pings a connection before it goes back to the pool: a ping whose
    // reply is dropped would keep the one connection out of it.
    until(
        Duration::from_secs(10),
        "the connection back in the pool",
        || async { client.pool().num_idle() == 1 },
    )
    .await;
}

#[tokio::test]
async fn a_lost_acquire_reply_leaves_no_phantom() {
    let store = postgres::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let op_timeout = Duration::from_millis(500).mul_f64(scale());
    // One pooled connection, so the acquire goes on the one `warm_up` prepared.
    let url = format!(
        "{}?lock_op_timeout_ms={}&lock_pool_size=1",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let blind = PostgresBackend::connect(&url).await.unwrap();
    let other = PostgresBackend::connect(&store.url()).await.unwrap();
    let name = lock_name("phantom");
    let before = match other.try_acquire_for(&name, Duration::from_secs(5)).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the free lock: {other:?}"),
    };
    other.release(&before).await.unwrap();
    warm_up(&blind).await;

    // The request reaches the server; its reply is lost.
    proxy.set(Mode::DropDownstream);
    let ttl = Duration::from_secs(120);
    let err = blind
        .try_acquire_for(&name, ttl)
        .await
        .expect_err("no reply, no answer");
    assert!(err.is_retryable(), "{err:?}");
    let phantom = other
        .inspect(&name)
        .await
        .unwrap()
        .expect("the server granted the acquire whose reply was lost");
    assert!(phantom.fence > before.fence());

    // The network heals: the phantom goes within a few operation timeouts
    // and a round of retry backoff (1 s at most), far below the TTL.
    proxy.set(Mode::Pass);
    let healed = Instant::now();
    let within = (op_timeout * 3 + Duration::from_secs(2)).mul_f64(scale());
    let next = eventually(within, "the phantom's removal", || async {
        other
            .try_acquire_for(&name, Duration::from_secs(30))
            .await
            .unwrap()
            .into_lease()
    })
    .await;
    eprintln!("phantom removed {:?} after healing", healed.elapsed());
    assert!(next.fence() > phantom.fence, "fences only grow");
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released,
        "the cleanup never touches a later holder's grant"
    );
}

/// The cleanup is owner-checked: a later holder's grant of the same name,
/// taken before the cleanup ran, is left alone.
#[tokio::test]
async fn the_cleanup_never_frees_a_later_grant() {
    let store = postgres::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let op_timeout = Duration::from_millis(300).mul_f64(scale());
    let ttl = Duration::from_millis(400).mul_f64(scale());
    // One pooled connection, so the acquire goes on the one `warm_up` prepared.
    let url = format!(
        "{}?lock_op_timeout_ms={}&lock_pool_size=1",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let blind = PostgresBackend::connect(&url).await.unwrap();
    let other = PostgresBackend::connect(&store.url()).await.unwrap();
    let name = lock_name("later");
    warm_up(&blind).await;
    proxy.set(Mode::DropDownstream);
    blind
        .try_acquire_for(&name, ttl)
        .await
        .expect_err("no reply");
    // The phantom expires while the network is still down; another client
    // takes the name.
    let next = eventually(
        ttl + Duration::from_secs(2),
        "the phantom's expiry",
        || async {
            other
                .try_acquire_for(&name, Duration::from_secs(60))
                .await
                .unwrap()
                .into_lease()
        },
    )
    .await;
    proxy.set(Mode::Pass);
    // Whatever the cleanup does once it gets through, the later grant stays.
    blind.inspect(&name).await.ok();
    let give_up = Instant::now() + (op_timeout * 3 + Duration::from_secs(2)).mul_f64(scale());
    while Instant::now() < give_up {
        let holder = other.inspect(&name).await.unwrap();
        assert_eq!(holder.map(|h| h.fence), Some(next.fence()), "S1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}
