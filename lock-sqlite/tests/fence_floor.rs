//! The fence floor at the end of the counter's range: a floor the file's
//! counter (a SQLite integer, up to `i64::MAX`) could not count past is
//! refused before any I/O and changes nothing; the largest floor accepted
//! still leaves room to grant; a counter at its very end refuses grants
//! with a clear error instead of turning into a float.

mod support;

use std::path::Path;
use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{FencingToken, LockBackend, LockError, LockName};
use sqlx::Connection;

fn name(n: &str) -> LockName {
    LockName::new(n).unwrap()
}

/// The counter as the file has it, and its SQLite type.
async fn counter(path: &Path) -> (String, String) {
    let mut conn = sqlx::SqliteConnection::connect(&support::url(path))
        .await
        .unwrap();
    let row = sqlx::query_as("SELECT CAST(last AS TEXT), typeof(last) FROM distlock_fence")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    row
}

#[tokio::test]
async fn a_floor_the_counter_cannot_count_past_is_refused_before_any_io() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let caps = backend.capabilities();
    assert_eq!(caps.max_fence, i64::MAX as u64);
    let before = counter(file.path()).await;
    for too_high in [
        caps.max_fence_floor() + 1,
        i64::MAX as u64 - 10,
        i64::MAX as u64,
        u64::MAX,
    ] {
        let too_high = FencingToken::new(too_high).unwrap();
        for refused in [
            backend.raise_fence_floor(too_high).await,
            lockcore::admin::raise_fence_floor(&backend, too_high).await,
        ] {
            assert!(
                matches!(&refused, Err(e @ LockError::InvalidConfig { .. }) if e.to_string().contains("at most")),
                "{too_high}: {refused:?}"
            );
        }
    }
    assert_eq!(
        counter(file.path()).await,
        before,
        "a refused floor moved the counter"
    );
    // Before any I/O: a closed client says the same, not Unavailable.
    backend.close().await.unwrap();
    let refused = backend
        .raise_fence_floor(FencingToken::new(u64::MAX).unwrap())
        .await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig { .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn the_largest_floor_accepted_still_grants() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let highest = backend.capabilities().max_fence_floor();
    backend
        .raise_fence_floor(FencingToken::new(highest).unwrap())
        .await
        .unwrap();
    let mut last = highest;
    for round in 0..3 {
        let lease = backend
            .try_acquire_for(&name(&format!("after-{round}")), Duration::from_secs(60))
            .await
            .unwrap()
            .into_lease()
            .expect("a free lock");
        assert!(lease.fence().get() > last);
        last = lease.fence().get();
        backend.release(&lease).await.unwrap();
    }
    assert_eq!(counter(file.path()).await.1, "integer");
    backend.close().await.unwrap();
}

/// Only a counter set by hand gets there (the floor leaves 2^32 grants of
/// room): every grant is refused, saying why, and the counter stays an
/// integer.
#[tokio::test]
async fn a_counter_at_its_end_refuses_grants_clearly() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&support::url(file.path()))
        .await
        .unwrap();
    sqlx::query("UPDATE distlock_fence SET last = ?1")
        .bind(i64::MAX)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    for _ in 0..2 {
        let refused = backend
            .try_acquire_for(&name("at-the-end"), Duration::from_secs(60))
            .await;
        assert!(
            matches!(&refused, Err(e @ LockError::Store { .. }) if e.to_string().contains("at its end")),
            "{refused:?}"
        );
    }
    assert_eq!(
        counter(file.path()).await,
        (i64::MAX.to_string(), "integer".to_owned())
    );
    backend.close().await.unwrap();
}
