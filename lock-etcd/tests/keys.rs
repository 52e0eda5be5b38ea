//! The key scheme and TTLs, against real etcd servers from the harness: TTL
//! rounding and the cluster's minimum, keys under the prefix and their
//! reuse, stale releases of a reused key.

mod support;

use std::time::Duration;

use lock_conformance::stores::etcd;
use lock_etcd::etcd_client::GetOptions;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError, LockName, ReleaseOutcome};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_are_whole_seconds_and_never_below_the_clusters_minimum() {
    // etcd's default election timeout (1 s) makes its minimum lease TTL 2 s,
    // and etcd silently turns 1 s into 2 s: the backend must learn this and
    // refuse rather than report a TTL it does not get.
    let store =
        tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default().timing(100, 1000)))
            .await
            .unwrap()
            .expect("a private etcd with default election settings");
    let url = store.url();
    let backend = connect(&url).await;
    let caps = backend.capabilities();
    assert_eq!(caps.min_ttl, Duration::from_secs(2), "{caps:?}");
    assert_eq!(caps.ttl_granularity, Duration::from_secs(1));
    let lock = name("ttl");
    for too_short in [
        Duration::from_millis(1),
        Duration::from_secs(1),
        Duration::from_millis(1999),
    ] {
        let outcome = backend.try_acquire_for(&lock, too_short).await;
        assert!(
            matches!(outcome, Err(LockError::InvalidTtl { .. })),
            "{too_short:?}: {outcome:?}"
        );
    }
    assert!(backend.inspect(&lock).await.unwrap().is_none());
    let mut client = raw(&url).await;
    for (ask, enforced) in [(2000, 2), (2001, 3), (2500, 3), (7000, 7)] {
        let lease = acquire(&backend, &lock, Duration::from_millis(ask)).await;
        assert_eq!(lease.ttl(), Duration::from_secs(enforced), "asked {ask} ms");
        let id = etcd_lease_of(&mut client, &backend.key_of(&lease).unwrap()).await;
        let ttl = client.lease_time_to_live(id, None).await.unwrap();
        assert_eq!(
            ttl.granted_ttl(),
            enforced as i64,
            "etcd's own view of {ask} ms"
        );
        assert_eq!(
            backend.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    // No cap below etcd's own maximum: the declared slack grows with the TTL
    // instead (a leader change restarts a lease at its full TTL).
    assert_eq!(caps.max_ttl, lock_etcd::MAX_TTL);
    let hour = Duration::from_secs(3600);
    let fixed = Duration::from_secs(2) * 10 / 3 + Duration::from_secs(1);
    assert_eq!(caps.slack_for(hour), hour + fixed, "{caps:?}");
    assert_eq!(
        caps.slack_for(Duration::from_secs(2)),
        Duration::from_secs(2) + fixed
    );
    let long = acquire(&backend, &lock, hour).await;
    assert_eq!(long.ttl(), hour);
    backend.release(&long).await.unwrap();
    // The harness's shared etcd runs a 100 ms election timeout: 1 s leases work.
    let shared = connect(&etcd::shared().url()).await;
    assert_eq!(shared.capabilities().min_ttl, Duration::from_secs(1));
    let lease = acquire(&shared, &lock, Duration::from_secs(1)).await;
    assert_eq!(lease.ttl(), Duration::from_secs(1));
    shared.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_live_under_the_prefix_and_leases_are_reused() {
    let url = etcd::shared().url();
    let prefix = format!("keys-test-{:08x}/", rand_u32());
    let backend = EtcdBackend::connect_with(EtcdConfig::new([url.as_str()]).prefix(prefix.clone()))
        .await
        .unwrap();
    let mut client = raw(&url).await;
    let lock = LockName::new("jobs/nightly 100%").unwrap();
    let first = acquire(&backend, &lock, Duration::from_secs(10)).await;
    let all = client
        .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(all.kvs().len(), 1, "one key per held lock");
    let kv = &all.kvs()[0];
    let key = kv.key_str().unwrap();
    let expected = format!("{prefix}jobs%2Fnightly 100%25/");
    assert!(key.starts_with(&expected), "{key}");
    assert_eq!(
        key.len(),
        expected.len() + 16,
        "16 hex digits of lease id: {key}"
    );
    assert_eq!(kv.value_str().unwrap(), first.owner().encode());
    assert_eq!(
        kv.create_revision() as u64,
        first.fence().get(),
        "fence = create revision"
    );
    assert_ne!(kv.lease(), 0, "attached to a lease");
    assert_eq!(
        backend.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    let all = client
        .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(all.kvs().is_empty(), "release deletes the key");
    assert!(
        backend.idle_leases() >= 1,
        "the lease went back to the pool"
    );
    let second = acquire(&backend, &lock, Duration::from_secs(10)).await;
    assert_eq!(
        backend.key_of(&second),
        backend.key_of(&first),
        "the pooled lease (and so the key) is reused: one round trip per acquire"
    );
    assert!(second.fence() > first.fence());
    backend.release(&second).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_never_deletes_a_newer_grant_of_the_same_key() {
    // etcd's own Unlock deletes by key name; here the same client reuses the
    // same lease, hence the same key, and the old grant's retried release
    // and renew must still miss the new grant.
    let backend = connect(&etcd::shared().url()).await;
    let lock = name("stale");
    let old = acquire(&backend, &lock, Duration::from_secs(10)).await;
    assert_eq!(
        backend.release(&old).await.unwrap(),
        ReleaseOutcome::Released
    );
    let new = acquire(&backend, &lock, Duration::from_secs(10)).await;
    assert_eq!(backend.key_of(&new), backend.key_of(&old), "same key");
    assert_eq!(
        backend.release(&old).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert!(matches!(
        backend.renew(&old).await,
        Err(LockError::NotHeld { .. })
    ));
    let holder = backend.inspect(&lock).await.unwrap().expect("still held");
    assert_eq!(holder.fence, new.fence());
    assert_eq!(holder.owner, Some(new.owner()));
    assert_eq!(
        backend.release(&new).await.unwrap(),
        ReleaseOutcome::Released
    );
}
