//! The key scheme and TTLs, against real etcd servers from the harness: TTL
//! rounding and the cluster's minimum, keys under the prefix and their
//! reuse, stale releases of a reused key.

use std::time::Duration;

use lock_conformance::kit::stores::etcd;
use lock_etcd::etcd_client::GetOptions;
use lock_etcd::testing::{key_of, sessions};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{HolderLabel, LockBackend, LockError, LockName, ReleaseOutcome};

use crate::support::*;

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
    let url = store.endpoint();
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
        assert_eq!(
            lease.ttl().get(),
            Duration::from_secs(enforced),
            "asked {ask} ms"
        );
        let id = etcd_lease_of(&mut client, &key_of(&lease).unwrap()).await;
        let ttl = client.lease_time_to_live(id, None).await.unwrap();
        assert_eq!(
            ttl.granted_ttl(),
            enforced as i64,
            "etcd's own view of {ask} ms"
        );
        // inspect reports the upper end of what etcd has left (it counts
        // whole seconds, rounded down), never more than the TTL: at least
        // etcd's count read after it, plus one.
        let left = backend
            .inspect(&lock)
            .await
            .unwrap()
            .and_then(|holder| holder.expires_in)
            .expect("a held lock's remaining time");
        let after = client.lease_time_to_live(id, None).await.unwrap().ttl() as u64;
        assert!(
            left <= Duration::from_secs(enforced)
                && left >= Duration::from_secs((after + 1).min(enforced)),
            "asked {ask} ms: inspect says {left:?} left, etcd then {after} s"
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
    assert_eq!(long.ttl().get(), hour);
    backend.release(&long).await.unwrap();
    // The harness's shared etcd runs a 100 ms election timeout: 1 s leases work.
    let shared = connect(&etcd::shared().endpoint()).await;
    assert_eq!(shared.capabilities().min_ttl, Duration::from_secs(1));
    let lease = acquire(&shared, &lock, Duration::from_secs(1)).await;
    assert_eq!(lease.ttl().get(), Duration::from_secs(1));
    shared.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_live_under_the_prefix_share_one_session_and_are_reused() {
    let url = etcd::shared().endpoint();
    let prefix = format!("keys-test-{:08x}/", rand_u32());
    let backend = EtcdBackend::connect_with(EtcdConfig::new([url.as_str()]).prefix(prefix.clone()))
        .await
        .unwrap();
    let mut client = raw(&url).await;
    let lock = LockName::new("jobs/nightly 100%").unwrap();
    let queue = format!("{prefix}jobs%2Fnightly 100%25/");
    let label = HolderLabel::new("keys test, worker 3").unwrap();
    let request = LockRequest::new(
        lock.clone(),
        backend
            .capabilities()
            .effective_ttl(Duration::from_secs(10))
            .unwrap(),
    )
    .with_label(label.clone());
    let first = backend
        .try_acquire(&request)
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    let entries = client
        .get(queue.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(entries.kvs().len(), 1, "one key per held lock");
    let kv = &entries.kvs()[0];
    let session = kv.lease();
    assert_ne!(session, 0, "attached to a lease");
    assert_eq!(
        kv.key_str().unwrap(),
        format!("{queue}{:016x}.0", session as u64),
        "named after the session lease and a number"
    );
    assert_eq!(
        kv.value_str().unwrap(),
        format!("{}\n0\n{label}", first.owner().encode()),
        "owner token, fence offset, label"
    );
    assert_eq!(
        kv.create_revision() as u64,
        first.fence().get(),
        "fence = create revision"
    );
    // The session's marker lives with it, outside every queue.
    let marker = client
        .get(
            format!("{prefix}/sessions/{:016x}/alive", session as u64),
            None,
        )
        .await
        .unwrap();
    assert_eq!(marker.kvs().first().map(|kv| kv.lease()), Some(session));

    // Another lock of the same TTL goes on the same session.
    let other = acquire(
        &backend,
        &LockName::new("other").unwrap(),
        Duration::from_secs(10),
    )
    .await;
    let key = key_of(&other).unwrap();
    let other_kv = client.get(key, None).await.unwrap();
    assert_eq!(other_kv.kvs()[0].lease(), session, "one session per TTL");
    assert_eq!(sessions(&backend), 1);

    assert_eq!(
        backend.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    let entries = client
        .get(queue.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(entries.kvs().is_empty(), "release deletes the key");
    let second = acquire(&backend, &lock, Duration::from_secs(10)).await;
    assert_eq!(
        key_of(&second),
        key_of(&first),
        "the number (and so the key) is reused: a hot name keeps one key"
    );
    assert!(second.fence() > first.fence());
    backend.release(&second).await.unwrap();
    backend.release(&other).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_never_deletes_a_newer_grant_of_the_same_key() {
    // etcd's own Unlock deletes by key name; here the same client reuses the
    // same lease, hence the same key, and the old grant's retried release
    // and renew must still miss the new grant.
    let backend = connect(&etcd::shared().endpoint()).await;
    let lock = name("stale");
    let old = acquire(&backend, &lock, Duration::from_secs(10)).await;
    assert_eq!(
        backend.release(&old).await.unwrap(),
        ReleaseOutcome::Released
    );
    let new = acquire(&backend, &lock, Duration::from_secs(10)).await;
    assert_eq!(key_of(&new), key_of(&old), "same key");
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
