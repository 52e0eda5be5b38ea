//! Multi-locks in one `Txn` (`try_acquire_each`): every name's entry put
//! at one revision under compares that every queue is empty, or nothing
//! written at all. What the conformance suite cannot see: the store's
//! revision unmoved by a refused attempt, the entries and their sessions,
//! fences above a raised floor, a waiting multi-lock's requests, and an
//! attempt dropped in flight undone long before its TTL.

use std::time::Duration;

use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::etcd;
use lock_etcd::etcd_client::{Client, EventType, WatchOptions};
use lock_etcd::testing::key_of;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{AttemptEach, FencingToken, HolderLabel, Lease, LockBackend, LockError, Locker};
use tokio::time::Instant;

use crate::support::*;

const TTL: Duration = Duration::from_secs(4);

fn requests(
    backend: &EtcdBackend,
    names: &[&lockcore::LockName],
    ttl: Duration,
) -> Vec<LockRequest> {
    let ttl = backend.capabilities().effective_ttl(ttl).unwrap();
    names
        .iter()
        .map(|name| {
            LockRequest::new((*name).clone(), ttl).with_label(HolderLabel::new("multi").unwrap())
        })
        .collect()
}

async fn all(backend: &EtcdBackend, requests: &[LockRequest]) -> Vec<Lease> {
    match backend.try_acquire_each(requests).await.unwrap() {
        AttemptEach::Acquired(leases) => leases,
        held => panic!("every name should be free: {held:?}"),
    }
}

/// The key's create revision and lease, read from etcd.
async fn created(raw: &mut Client, lease: &Lease) -> (i64, i64) {
    let key = key_of(lease).unwrap();
    let reply = raw.get(key, None).await.unwrap();
    let kv = reply.kvs().first().expect("the grant's key exists");
    (kv.create_revision(), kv.lease())
}

/// The store's revision now.
/// Every entry is put by the one `Txn`, at one revision: each name's fence
/// is that revision (plus the offset), as inspect says; each entry is on
/// the session of its own TTL; after a raise, every fence is above the
/// floor; a held name is named, and nothing else taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_txn_one_revision_one_session_per_ttl_fences_above_the_floor() {
    let url = etcd::shared().endpoint();
    // A prefix of its own: the raise below moves no other test's floor.
    let prefix = format!("etcd-test/multi-{:08x}/", rand_u32());
    let config = || EtcdConfig::new([url.clone()]).prefix(prefix.clone());
    let a = EtcdBackend::connect_with(config()).await.unwrap();
    let b = EtcdBackend::connect_with(config()).await.unwrap();
    let mut raw = raw(&url).await;
    let (x, y, w) = (name("multi-x"), name("multi-y"), name("multi-w"));
    let before = acquire(&a, &y, TTL).await;
    a.release(&before).await.unwrap();

    let mut asked = requests(&a, &[&x], TTL);
    asked.extend(requests(&a, &[&y], TTL * 2));
    let leases = all(&a, &asked).await;
    assert_eq!(leases.len(), 2);
    let (rx, lx) = created(&mut raw, &leases[0]).await;
    let (ry, ly) = created(&mut raw, &leases[1]).await;
    assert_eq!(rx, ry, "one Txn, one revision");
    assert_ne!(lx, ly, "a session per TTL");
    for (lease, asked) in leases.iter().zip(&asked) {
        assert_eq!(lease.name(), asked.name());
        assert_eq!(lease.ttl(), asked.ttl());
        assert_eq!(lease.fence().get(), rx as u64, "the fence is the revision");
        let holder = b.inspect(lease.name()).await.unwrap().expect("held");
        assert_eq!(holder.fence, lease.fence());
        assert_eq!(holder.label.unwrap().as_str(), "multi");
    }
    assert!(leases[1].fence() > before.fence());

    let refused = b.try_acquire_each(&requests(&b, &[&w, &y], TTL)).await;
    assert!(
        matches!(&refused, Ok(AttemptEach::Held { name, .. }) if *name == y),
        "{refused:?}"
    );
    assert!(b.inspect(&w).await.unwrap().is_none(), "nothing else taken");

    let floor = FencingToken::new(rx as u64 * 1000).unwrap();
    b.raise_fence_floor(floor).await.unwrap();
    for lease in &leases {
        a.release(lease).await.unwrap();
    }
    // `a` learns the raise from its refused compare, and writes again.
    let after = all(&a, &requests(&a, &[&w, &x, &y], TTL)).await;
    for lease in &after {
        assert!(lease.fence() > floor, "{} not above {floor}", lease.fence());
        let holder = b.inspect(lease.name()).await.unwrap().expect("held");
        assert_eq!(holder.fence, lease.fence());
        a.release(lease).await.unwrap();
    }
}

/// A refused attempt writes nothing: the store's revision does not move
/// (one name held, the other two free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_multi_lock_writes_nothing() {
    let store = private_etcd().await;
    let (a, b) = (
        connect(&store.endpoint()).await,
        connect(&store.endpoint()).await,
    );
    let mut raw = raw(&store.endpoint()).await;
    let (x, y, z) = (name("refused-x"), name("refused-y"), name("refused-z"));
    let held = acquire(&a, &z, TTL).await;
    // `b`'s session exists before the count starts.
    let warm = acquire(&b, &x, TTL).await;
    b.release(&warm).await.unwrap();

    let before = revision(&mut raw).await;
    for _ in 0..3 {
        let refused = b.try_acquire_each(&requests(&b, &[&x, &y, &z], TTL)).await;
        assert!(
            matches!(&refused, Ok(AttemptEach::Held { name, .. }) if *name == z),
            "{refused:?}"
        );
    }
    assert_eq!(revision(&mut raw).await, before, "a refused attempt wrote");
    a.release(&held).await.unwrap();
    let leases = all(&b, &requests(&b, &[&x, &y, &z], TTL)).await;
    assert_eq!(
        revision(&mut raw).await,
        before + 2,
        "the release, then one Txn"
    );
    for lease in &leases {
        b.release(lease).await.unwrap();
    }
}

/// A multi-lock waiting for a held name asks etcd only when woken (a
/// release of one of its names) or at its re-check, not in a loop while
/// its other names are free; the release of the held name gets it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_multi_lock_sends_an_attempt_per_wakeup() {
    let store = private_etcd().await;
    let (a, b) = (
        connect(&store.endpoint()).await,
        connect(&store.endpoint()).await,
    );
    let (x, y, z) = (name("waits-x"), name("waits-y"), name("waits-z"));
    let held = acquire(&a, &z, TTL).await;
    let recheck = Duration::from_secs(1);
    let locker = Locker::new(b).ttl(TTL).recheck(recheck);
    let waited = scaled(Duration::from_secs(3));
    let before = metrics(&store).await;
    let waiting = tokio::spawn({
        let names = [x.clone(), y.clone(), z.clone()];
        async move { locker.acquire_all_timeout(&names, waited * 2).await }
    });
    tokio::time::sleep(waited).await;
    let after = metrics(&store).await;
    let txns = handled(&after, "Txn") - handled(&before, "Txn");
    let ranges = handled(&after, "Range") - handled(&before, "Range");
    // One attempt at first and one per re-check, the session's marker, and
    // some slack (5 in all, measured; a loop sent some 600).
    let most = (waited.as_secs_f64() / recheck.as_secs_f64()).ceil() + 4.0;
    assert!(
        txns <= most,
        "{txns} Txns in {waited:?} of waiting with a re-check every {recheck:?}"
    );
    // Each round arms a watch per name: a read of its holder.
    assert!(ranges <= 3.0 * most, "{ranges} Ranges in {waited:?}");
    a.release(&held).await.unwrap();
    let guard = tokio::time::timeout(scaled(Duration::from_secs(2)), waiting)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token(z.as_str()).unwrap() > held.fence());
    guard.release().await.unwrap();
}

/// An attempt dropped while its `Txn` is in flight (the reply is late)
/// is undone: each entry it put is deleted (seen on a watch of the
/// queues), long before the multi-lock's TTL (its session is retired,
/// too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_dropped_in_flight_is_undone() {
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = connect(&store.endpoint_via(proxy.addr())).await;
    let observer = connect(&store.endpoint()).await;
    let (x, y) = (name("dropped-x"), name("dropped-y"));
    let long = Duration::from_secs(60);
    let asked = requests(&client, &[&x, &y], long);
    // A session in use before the replies turn late.
    let warm = all(&client, &asked).await;
    let queues: Vec<Vec<u8>> = warm.iter().map(queue_of).collect();
    for lease in &warm {
        client.release(lease).await.unwrap();
    }
    let mut raw = raw(&store.endpoint()).await;
    let from = revision(&mut raw).await + 1;

    let late = scaled(Duration::from_secs(1));
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    let sent = Instant::now();
    let dropped = tokio::time::timeout(late / 2, client.try_acquire_each(&asked)).await;
    assert!(dropped.is_err(), "the reply came early: {dropped:?}");
    let within = late + scaled(Duration::from_secs(5));
    for queue in queues {
        // From before the attempt: the entry put, then deleted (it landed,
        // and was undone).
        let since = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut events = raw.watch(queue, Some(since)).await.unwrap();
        let (mut put, mut undone) = (None, false);
        while !undone {
            let reply = tokio::time::timeout(within, events.message())
                .await
                .expect("the entry put, then deleted")
                .unwrap()
                .expect("the watch goes on");
            for event in reply.events() {
                let key = event.kv().map(|kv| kv.key().to_vec());
                match event.event_type() {
                    EventType::Put => put = key,
                    EventType::Delete => undone |= put.is_some() && key == put,
                }
            }
        }
    }
    assert!(sent.elapsed() < long / 2, "freed by its TTL, not undone");
    for name in [&x, &y] {
        assert!(observer.inspect(name).await.unwrap().is_none());
    }
    proxy.set(Mode::Pass);
}

/// Bad input is a typed error before any I/O; more names than one `Txn`
/// takes are `Unsupported`, and a locker then takes them one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_too_many_names() {
    let backend = connect(&etcd::shared().endpoint()).await;
    let x = name("input-x");
    let twice = requests(&backend, &[&x, &x], TTL);
    let err = backend.try_acquire_each(&twice).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    let mut permit = requests(&backend, &[&x], TTL);
    permit[0] = permit[0].clone().with_permits(2);
    let err = backend.try_acquire_each(&permit).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    assert!(backend.inspect(&x).await.unwrap().is_none());

    let many: Vec<_> = (0..130).map(|i| name(&format!("many-{i}"))).collect();
    let refs: Vec<_> = many.iter().collect();
    let err = backend
        .try_acquire_each(&requests(&backend, &refs, TTL))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Unsupported {
                operation: "try_acquire_each",
                ..
            }
        ),
        "{err:?}"
    );
    let guard = Locker::new(backend.clone())
        .ttl(TTL)
        .acquire_all(&many)
        .await
        .unwrap();
    assert_eq!(guard.names().len(), 130);
    guard.release().await.unwrap();
}
