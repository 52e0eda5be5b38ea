//! The key scheme on a real server, TTL caps before any I/O, and values
//! distlock did not write.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::eventually;
use lock_conformance::kit::stores::redis::{self as launcher};
use lock_redis::redis::AsyncCommands;
use lock_redis::{MAX_TTL, RedisBackend, RedisConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockError, LockName};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_the_server_are_as_documented() {
    let url = launcher::shared().url();
    let prefix = format!("t{:x}:", rand_u64());
    let backend =
        RedisBackend::connect_with(RedisConfig::from_url(&url).unwrap().key_prefix(&prefix))
            .await
            .unwrap();
    let lock = LockName::new(format!("orders/{{42}}*?[x]%{:x}", rand_u64())).unwrap();
    let ttl = Duration::from_millis(30_000);
    let lease = take(&backend, &lock, ttl).await;
    let encoded = lock
        .as_str()
        .replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D");
    let lock_key = format!("{prefix}{{{encoded}}}");
    let mut con = raw(&url).await;
    let value: String = con.get(&lock_key).await.unwrap();
    assert_eq!(
        value,
        format!(
            "{}:{} {}",
            lease.owner().encode(),
            lease.fence(),
            lockcore::HolderLabel::this_process().as_str()
        ),
        "owner:fence, then the holder's label"
    );
    let pttl: i64 = con.pttl(&lock_key).await.unwrap();
    assert!(pttl > 0 && pttl <= 30_000, "PX must be the TTL: {pttl}");
    let fence: u64 = con.get(format!("{lock_key}:fence")).await.unwrap();
    assert_eq!(fence, lease.fence().get());
    let mut keys: Vec<String> = con.keys(format!("{prefix}*")).await.unwrap();
    keys.sort();
    let era: Vec<String> = keys
        .extract_if(.., |k| k.starts_with(&format!("{prefix}era:{{")))
        .collect();
    assert_eq!(keys.len(), 2, "one lock key and one fence key: {keys:?}");
    assert_eq!(era.len(), 1, "the era of the name's slot: {era:?}");
    let (id, from): (String, u64) = lock_redis::redis::cmd("HMGET")
        .arg(&era[0])
        .arg("id")
        .arg("from")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(id.len(), 40, "the server's replication id: {id}");
    assert_eq!(from, 0, "no failover seen, no lock delay");

    // Another prefix is another namespace.
    let other = RedisBackend::connect_with(
        RedisConfig::from_url(&url)
            .unwrap()
            .key_prefix(format!("u{:x}:", rand_u64())),
    )
    .await
    .unwrap();
    let elsewhere = take(&other, &lock, ttl).await;
    other.release(&elsewhere).await.unwrap();
    backend.release(&lease).await.unwrap();

    let bad =
        RedisBackend::connect_with(RedisConfig::from_url(&url).unwrap().key_prefix("a{b}:")).await;
    assert!(
        matches!(bad, Err(LockError::InvalidConfig { .. })),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_are_capped_and_rounded_before_any_io() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let lock = unique("ttl");
    for bad in [
        Duration::ZERO,
        Duration::from_micros(500),
        MAX_TTL + Duration::from_millis(1),
        Duration::from_millis(9_223_372_036_854_775),
        Duration::MAX,
    ] {
        let outcome = backend.try_acquire_for(&lock, bad).await;
        assert!(
            matches!(outcome, Err(LockError::InvalidTtl { .. })),
            "{bad:?}: {outcome:?}"
        );
    }
    assert_eq!(backend.inspect(&lock).await.unwrap(), None);
    let lease = take(&backend, &lock, Duration::from_micros(1_500)).await;
    assert_eq!(
        lease.ttl().get(),
        Duration::from_millis(2),
        "rounded up to whole ms"
    );
    // A 2 ms lease may already be gone; wait for it and take the name with the longest TTL.
    let lease = eventually(
        scaled(Duration::from_secs(1)),
        "the 2 ms lease's expiry",
        || async {
            backend
                .try_acquire_for(&lock, MAX_TTL)
                .await
                .unwrap()
                .into_lease()
        },
    )
    .await;
    let pttl: i64 = raw(&url)
        .await
        .pttl(format!("distlock:{{{}}}", lock.as_str()))
        .await
        .unwrap();
    assert!(pttl > MAX_TTL.as_millis() as i64 - 60_000, "{pttl}");
    backend.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_under_the_prefix_is_an_error_not_a_panic() {
    let url = launcher::shared().url();
    let backend = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let lock = unique("foreign");
    let () = raw(&url)
        .await
        .set(format!("distlock:{{{}}}", lock.as_str()), "not ours")
        .await
        .unwrap();
    assert!(matches!(
        backend.inspect(&lock).await,
        Err(LockError::Store { .. })
    ));
    assert!(matches!(
        backend.try_acquire_for(&lock, LONG).await,
        Ok(Attempt::Held { .. })
    ));
    let evicted = backend.evict(&lock, None).await.unwrap();
    assert_eq!(evicted, None);
    let lease = take(&backend, &lock, LONG).await;
    backend.release(&lease).await.unwrap();
}
