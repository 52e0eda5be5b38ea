//! etcd-specific behaviour, against real etcd servers from the harness: TTL
//! rounding and the cluster's minimum, the key scheme and lease reuse, stale
//! releases of a reused key, resource-side fencing with `fence_compare`, the
//! store-pushed loss signal, a waiter whose lease dies in line (etcd
//! #11456), and authentication with RBAC.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::stores::{etcd, eventually};
use lock_etcd::etcd_client::{Client, GetOptions, Permission, Txn, TxnOp};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::{LockBackendExt, WaitPolicy};
use lockcore::{
    Attempt, Lease, LockBackend, LockError, LockName, Locker, LossReason, OwnerToken,
    ReleaseOutcome,
};
use tokio::time::Instant;

fn name(prefix: &str) -> LockName {
    LockName::new(format!("etcd-test/{prefix}/{:08x}", rand_u32())).unwrap()
}

fn rand_u32() -> u32 {
    OwnerToken::new().as_uuid().as_u128() as u32
}

async fn connect(url: &str) -> EtcdBackend {
    EtcdBackend::connect_with(EtcdConfig::new([url]))
        .await
        .expect("connect to the harness etcd")
}

async fn raw(url: &str) -> Client {
    Client::connect([url], None).await.expect("raw client")
}

async fn acquire(backend: &EtcdBackend, name: &LockName, ttl: Duration) -> Lease {
    match backend
        .try_acquire_for(name, ttl)
        .await
        .expect("try_acquire")
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should be free"),
    }
}

/// The etcd lease behind a grant, read from etcd itself.
async fn etcd_lease_of(client: &mut Client, key: &[u8]) -> i64 {
    let reply = client.get(key.to_vec(), None).await.expect("get key");
    let kv = reply.kvs().first().expect("the grant's key exists");
    kv.lease()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_compare_lets_writes_into_etcd_through_only_while_held() {
    let url = etcd::shared().url();
    let (holder, admin) = (connect(&url).await, connect(&url).await);
    let lock = name("fenced");
    let resource = format!("etcd-test/resource/{:08x}", rand_u32());
    let write = |backend: &EtcdBackend, lease: &Lease, value: &str| {
        let txn = Txn::new()
            .when([backend.fence_compare(lease)])
            .and_then([TxnOp::put(resource.clone(), value, None)]);
        let mut client = backend.etcd_client();
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
        next.checked_ttl(),
        Instant::now(),
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
async fn lost_fires_when_etcd_drops_the_lease_not_at_the_next_renewal() {
    let url = etcd::shared().url();
    let backend = connect(&url).await;
    let mut client = raw(&url).await;
    // Renewals every 4 s: only the store-pushed signal can be fast.
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(12))
        .renew_every(Duration::from_secs(4));

    // 1. The lease is revoked behind our back (an operator, or etcd expiring it).
    let guard = locker.acquire(name("revoked")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // the watch opens after ttl/10, <= 250 ms
    let key = backend.key_of(&guard.lease()).unwrap();
    let id = etcd_lease_of(&mut client, &key).await;
    let revoked = Instant::now();
    client.lease_revoke(id).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() must fire well before the next renewal (4 s)");
    assert_eq!(reason, LossReason::StoreReported);
    assert!(!guard.is_held());
    assert!(revoked.elapsed() < Duration::from_secs(2));
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);

    // 2. A forced release.
    let lock = name("forced");
    let guard = locker.acquire(&lock).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    backend.evict(&lock, None).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() must fire at once on a forced release");
    assert_eq!(reason, LossReason::StoreReported);
    drop(guard);

    // 3. A plain release is not a loss.
    let guard = locker.acquire(name("released")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lost = guard.lost_token();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !lost.is_cancelled(),
        "our own release must not fire the loss signal"
    );
}

/// `LOCK_TEST_TIME_SCALE` (default 1.0).
fn scaled(d: Duration) -> Duration {
    let scale = std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0);
    d.mul_f64(scale)
}

/// Four times the slowest of a few round trips, plus 100 ms, scaled (as the
/// conformance suite's `Ctx::round_trip`).
async fn round_trip(backend: &EtcdBackend) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let sent = Instant::now();
        backend.inspect(&name("rtt")).await.unwrap();
        slowest = slowest.max(sent.elapsed());
    }
    scaled(slowest * 4 + Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_reach_a_connected_holder_within_the_declared_notice() {
    let url = etcd::shared().url();
    let (holder, admin) = (connect(&url).await, connect(&url).await);
    let notice = holder
        .capabilities()
        .eviction_notice
        .expect("etcd pushes evictions to the holder's watch: the notice must be declared");
    let bound = notice + round_trip(&holder).await;
    // Renewals every 4 s: only the pushed notice can be on time.
    let locker = Locker::new(holder.clone())
        .ttl(Duration::from_secs(5))
        .renew_every(Duration::from_secs(4));
    let mut took = Vec::new();
    for run in 0..25 {
        let lock = name("evicted");
        let guard = locker.acquire(&lock).await.unwrap();
        // Before and after the holder's watch starts (up to 300 ms in).
        tokio::time::sleep(Duration::from_millis(25 * run)).await;
        let fence = guard.fencing_token();
        let evicted = admin.evict(&lock, Some(fence)).await.unwrap();
        assert_eq!(evicted.map(|h| h.fence), Some(fence));
        let sent = Instant::now();
        let reason = tokio::time::timeout(bound, guard.lost())
            .await
            .unwrap_or_else(|_| {
                panic!("run {run}: lost() did not fire within {bound:?} of the eviction")
            });
        took.push(sent.elapsed());
        assert_eq!(reason, LossReason::StoreReported);
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
    }
    took.sort();
    eprintln!(
        "eviction notice: n={} min={:?} median={:?} max={:?} (declared {notice:?}, bound {bound:?})",
        took.len(),
        took[0],
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_evict_evicts_only_the_fence_it_names() {
    let url = etcd::shared().url();
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
    let key = holder.key_of(&held).unwrap();
    let queue = key[..key.len() - 16].to_vec();
    let mut client = raw(&url).await;
    eventually(Duration::from_secs(10), "the waiter in line", || {
        let (mut client, queue) = (client.clone(), queue.clone());
        async move {
            let count = client
                .get(
                    queue,
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await
                .unwrap()
                .count();
            (count == 2).then_some(())
        }
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
async fn a_waiter_whose_lease_dies_in_line_never_takes_the_lock_with_it() {
    // etcd #11456: a waiter whose lease expired was granted the lock. Here
    // the waiter's lease is revoked while it waits: its entry is gone, and it
    // must queue again, not claim the lock on the dead entry's revision.
    let url = etcd::shared().url();
    let (holder, waiter) = (connect(&url).await, connect(&url).await);
    let mut client = raw(&url).await;
    let lock = name("dead-waiter");
    let held = acquire(&holder, &lock, Duration::from_secs(10)).await;
    let waiting = {
        let (waiter, lock) = (waiter.clone(), lock.clone());
        tokio::spawn(async move {
            let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(20));
            waiter
                .acquire_for(&lock, Duration::from_secs(10), &wait)
                .await
        })
    };
    // Find the waiter's entry: the newer of the two queue entries.
    let queue_prefix = {
        let key = holder.key_of(&held).unwrap();
        key[..key.len() - 16].to_vec()
    };
    let entries = |client: &Client| {
        let (mut client, prefix) = (client.clone(), queue_prefix.clone());
        async move {
            client
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .unwrap()
                .kvs()
                .to_vec()
        }
    };
    let entry = eventually(
        Duration::from_secs(10),
        "the waiter's queue entry",
        || async {
            entries(&client)
                .await
                .into_iter()
                .find(|kv| kv.create_revision() as u64 != held.fence().get())
        },
    )
    .await;
    client.lease_revoke(entry.lease()).await.unwrap();
    // The waiter sees its entry gone and queues again, with a new entry.
    eventually(
        Duration::from_secs(10),
        "the waiter queueing again",
        || async {
            entries(&client)
                .await
                .iter()
                .any(|kv| kv.create_revision() > entry.create_revision())
                .then_some(())
        },
    )
    .await;
    assert!(!waiting.is_finished(), "the waiter must still be waiting");
    holder.release(&held).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter gets the lock after queueing again")
        .unwrap()
        .unwrap()
        .expect("granted before its deadline");
    assert!(
        lease.fence().get() > entry.create_revision() as u64,
        "granted on a new entry (fence {}), not the revoked one (revision {})",
        lease.fence(),
        entry.create_revision()
    );
    let holder_view = holder.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(holder_view.fence, lease.fence());
    waiter.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_roles_are_enforced_and_secrets_never_printed() {
    let store = tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default()))
        .await
        .unwrap()
        .expect("a private etcd for auth");
    let url = store.url();
    let mut root = raw(&url).await;
    root.user_add("root", "r00t-secret", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.role_add("app-locks").await.unwrap();
    root.role_grant_permission("app-locks", Permission::read_write("app/").with_prefix())
        .await
        .unwrap();
    root.user_add("locker", "s3cret-pw", None).await.unwrap();
    root.user_grant_role("locker", "app-locks").await.unwrap();
    root.auth_enable().await.unwrap();

    let config = EtcdConfig::new([url.as_str()])
        .prefix("app/")
        .user("locker", "s3cret-pw");
    let backend = EtcdBackend::connect_with(config.clone()).await.unwrap();
    for shown in [format!("{config:?}"), format!("{backend:?}")] {
        assert!(!shown.contains("s3cret-pw"), "{shown}");
    }
    let lock = name("rbac");
    let lease = acquire(&backend, &lock, Duration::from_secs(5)).await;
    assert_eq!(
        backend.inspect(&lock).await.unwrap().unwrap().fence,
        lease.fence()
    );
    backend.release(&lease).await.unwrap();

    // Outside its prefix the same user is refused, permanently (no retry storm).
    let outside = EtcdBackend::connect_with(config.clone().prefix("other/"))
        .await
        .unwrap();
    let refused = outside.try_acquire_for(&lock, Duration::from_secs(5)).await;
    assert!(
        matches!(refused, Err(LockError::Store { .. })),
        "{refused:?}"
    );
    assert!(!refused.unwrap_err().is_retryable());

    // Wrong password and no credentials: typed errors, secrets not echoed.
    let wrong = EtcdBackend::connect_with(config.clone().user("locker", "not-the-pw")).await;
    let err = wrong.unwrap_err();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    assert!(!err.to_string().contains("not-the-pw"));
    // etcd 3.4 lets anyone grant leases, so an anonymous client connects,
    // but cannot write a single key.
    let anonymous = EtcdBackend::connect_with(EtcdConfig::new([url.as_str()]).prefix("app/"))
        .await
        .unwrap();
    let refused = anonymous
        .try_acquire_for(&lock, Duration::from_secs(5))
        .await;
    assert!(
        matches!(refused, Err(LockError::Store { .. })),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_url_mistakes_are_typed_errors() {
    let store = etcd::shared();
    let plain = store.addr();
    // TLS towards a plaintext server: a clean error, no panic, no hang.
    let started = Instant::now();
    let tls = EtcdBackend::connect(&format!("etcds://{plain}?timeout=2")).await;
    let err = tls.unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. } | LockError::Store { .. }),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    for bad in [
        "etcd://",
        "etcd://h:1?cert=/missing/cert.pem&key=/missing/key.pem",
        "http://h:1",
    ] {
        let err = EtcdBackend::connect(bad).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{bad}: {err:?}"
        );
    }
    // Nobody listening: Unavailable, within the configured time.
    let nobody = EtcdConfig::new(["http://127.0.0.1:1"]).request_timeout(Duration::from_secs(1));
    let err = EtcdBackend::connect_with(nobody).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_name_their_cause_within_the_connect_timeout() {
    let connect_timeout = scaled(Duration::from_secs(2));
    let config = |endpoints: &[&str]| {
        EtcdConfig::new(endpoints.iter().copied()).connect_timeout(connect_timeout)
    };
    let failed = |config: EtcdConfig| async move {
        let started = Instant::now();
        let err = EtcdBackend::connect_with(config)
            .await
            .expect_err("connect must fail");
        let took = started.elapsed();
        assert!(took < connect_timeout, "{took:?} to report: {err}");
        err
    };

    // A closed port (with and without credentials, one or every endpoint):
    // retryable, and the message says the connection was refused.
    let closed = ["http://127.0.0.1:1", "http://127.0.0.1:2"];
    for config in [
        config(&closed[..1]),
        config(&closed),
        config(&closed[..1]).user("locker", "s3cret-pw"),
    ] {
        let err = failed(config).await;
        assert!(err.is_retryable(), "{err:?}");
        let text = err.to_string();
        assert!(text.to_lowercase().contains("connection refused"), "{text}");
        assert!(!text.contains("s3cret-pw"), "{text}");
    }

    // Wrong credentials: permanent, and the message says so.
    let store = tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default()))
        .await
        .unwrap()
        .expect("a private etcd for auth");
    let url = store.url();
    let mut root = raw(&url).await;
    root.user_add("root", "r00t-secret", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.auth_enable().await.unwrap();
    for (user, password) in [("root", "not-the-pw"), ("nobody", "not-the-pw")] {
        let err = failed(config(&[url.as_str()]).user(user, password)).await;
        assert!(matches!(err, LockError::Store { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("authentication failed"), "{text}");
        assert!(!text.contains("not-the-pw"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facade_style_url_connects() {
    let store = etcd::shared();
    let backend: Arc<dyn LockBackend> = Arc::new(
        EtcdBackend::connect(&format!("etcd://{}/url-test/", store.addr()))
            .await
            .unwrap(),
    );
    let lock = name("url");
    let lease = backend
        .try_acquire_for(&lock, Duration::from_secs(3))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert_eq!(
        backend.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}
