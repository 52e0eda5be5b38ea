//! Restoring etcd from an older snapshot moves revisions, and so fences,
//! back; the procedure (raise the fence floor to the highest fence seen
//! before reopening) makes every fence handed out afterwards larger again,
//! for every name, permit and waiter already in line.

use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::stores::etcd;
use lock_etcd::EtcdBackend;
use lock_etcd::etcd_client::Client;
use lock_etcd::testing::key_of;
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{FencingToken, Lease, LockBackend, LockError, LockName};
use tokio::time::Instant;

use crate::support::*;

const TTL: Duration = Duration::from_secs(10);

/// A few acquire/release cycles of `lock`; the last fence.
async fn cycles(backend: &EtcdBackend, lock: &LockName, n: usize) -> FencingToken {
    let mut last = None;
    for _ in 0..n {
        let lease = acquire(backend, lock, TTL).await;
        last = Some(lease.fence());
        backend.release(&lease).await.unwrap();
    }
    last.expect("at least one cycle")
}

/// A waiter of `name` (held as `held`), spawned and seen in line.
async fn queue_a_waiter(
    waiter: &EtcdBackend,
    name: &LockName,
    held: &Lease,
    raw: &Client,
) -> tokio::task::JoinHandle<Result<Option<Lease>, LockError>> {
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let wait = WaitPolicy::new(Instant::now() + scaled(Duration::from_secs(30)));
            waiter.acquire_for(&name, TTL, &wait).await
        })
    };
    let queue = queue_of(held);
    until(
        scaled(Duration::from_secs(10)),
        "the waiter in line",
        || {
            let (mut raw, queue) = (raw.clone(), queue.clone());
            async move { queue_len(&mut raw, queue).await == 2 }
        },
    )
    .await;
    waiting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_fences_go_back_until_the_floor_is_raised() {
    let store = private_etcd().await;
    let backup = tempfile::tempdir().unwrap();
    let snapshot = backup.path().join("snapshot.db");
    let lock = name("restored");
    {
        let before = connect(&store.endpoint()).await;
        cycles(&before, &lock, 3).await;
        let (store, snapshot) = (&store, snapshot.clone());
        tokio::task::block_in_place(|| etcd::snapshot(store, &snapshot))
            .expect("etcdctl snapshot save");
    }
    // History the restore will lose: the resource saw these fences.
    let highest = {
        let lost = connect(&store.endpoint()).await;
        cycles(&lost, &lock, 5).await
    };
    tokio::task::block_in_place(|| etcd::restore(&store, &snapshot))
        .expect("etcdctl snapshot restore");

    // Without the procedure, the next fence goes back: the resource would
    // refuse it, or worse, take it for a new holder's if it forgot.
    let client = connect(&store.endpoint()).await;
    let back = cycles(&client, &lock, 1).await;
    assert!(
        back <= highest,
        "the restore did not move fences back ({back} after {highest}): the test shows nothing"
    );

    // A waiter already in line when the floor is raised.
    let (holder, waiter) = (
        connect(&store.endpoint()).await,
        connect(&store.endpoint()).await,
    );
    let queued = name("queued");
    let held = acquire(&holder, &queued, TTL).await;
    let raw = raw(&store.endpoint()).await;
    let waiting = queue_a_waiter(&waiter, &queued, &held, &raw).await;

    // The procedure: raise the floor to the highest fence seen.
    client.raise_fence_floor(highest).await.unwrap();
    let again = cycles(&client, &lock, 1).await;
    let fresh = cycles(&client, &name("never-used"), 1).await;
    let ttl = client.capabilities().effective_ttl(TTL).unwrap();
    let permit = client
        .try_acquire_permit(&LockRequest::new(name("permits"), ttl), 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    client.release(&permit).await.unwrap();
    holder.release(&held).await.unwrap();
    let waited = tokio::time::timeout(scaled(Duration::from_secs(10)), waiting)
        .await
        .expect("the waiter is served")
        .unwrap()
        .unwrap()
        .expect("granted");
    for (what, fence) in [
        ("the restored name", again),
        ("a never-used name", fresh),
        ("a permit", permit.fence()),
        ("a waiter queued before the raise", waited.fence()),
    ] {
        assert!(
            fence > highest,
            "{what}: fence {fence}, not above the floor {highest}"
        );
    }
    let seen = waiter.inspect(&queued).await.unwrap().expect("held");
    assert_eq!(seen.fence, waited.fence(), "inspect agrees with the holder");
    waiter.release(&waited).await.unwrap();
    // Raising it lower again moves nothing back.
    client.raise_fence_floor(back).await.unwrap();
    assert!(cycles(&client, &lock, 1).await > again);
}

/// A floor the counter could not count past is refused before any I/O
/// (here the store is out of reach: the answer still comes at once) and
/// changes nothing; the largest floor accepted still lets locks, waiters
/// and permits be granted, with fences above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_beyond_the_counter_is_refused_and_the_largest_one_still_grants() {
    use lock_conformance::kit::proxy::{FaultProxy, Mode};
    use lockcore::{Capabilities, LockError};
    let store = private_etcd().await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let timeout = scaled(Duration::from_secs(2));
    let cut_off = EtcdBackend::connect_with(
        lock_etcd::EtcdConfig::new([store.endpoint_via(proxy.addr())]).request_timeout(timeout),
    )
    .await
    .unwrap();
    let caps = cut_off.capabilities();
    assert_eq!(caps.max_fence, i64::MAX as u64);
    let largest = caps.max_fence_floor();
    assert_eq!(
        largest,
        i64::MAX as u64 - Capabilities::FENCE_FLOOR_HEADROOM
    );
    let mut raw = raw(&store.endpoint()).await;
    let floor_key = b"distlock//fence-floor".to_vec();
    let before = raw.get(floor_key.clone(), None).await.unwrap().kvs().len();
    proxy.set(Mode::Blackhole);
    for too_high in [largest + 1, i64::MAX as u64, u64::MAX] {
        let too_high = FencingToken::new(too_high).unwrap();
        let sent = Instant::now();
        let refused = cut_off.raise_fence_floor(too_high).await;
        assert!(
            matches!(refused, Err(LockError::InvalidConfig { .. })),
            "floor {too_high}: {refused:?}"
        );
        assert!(
            sent.elapsed() < timeout / 2,
            "floor {too_high} refused only after {:?}: it went to the store",
            sent.elapsed()
        );
    }
    proxy.set(Mode::Pass);
    let after = raw.get(floor_key.clone(), None).await.unwrap();
    assert_eq!(after.kvs().len(), before, "a refused floor was written");

    // The largest floor accepted: every kind of grant still works above it.
    let client = connect(&store.endpoint()).await;
    let holder = connect(&store.endpoint()).await;
    let queued = name("largest-floor-queued");
    let held = acquire(&holder, &queued, TTL).await;
    let waiting = queue_a_waiter(&client, &queued, &held, &raw).await;
    let floor = FencingToken::new(largest).unwrap();
    client.raise_fence_floor(floor).await.unwrap();
    let lock = cycles(&client, &name("largest-floor"), 2).await;
    let ttl = client.capabilities().effective_ttl(TTL).unwrap();
    let permit = client
        .try_acquire_permit(&LockRequest::new(name("largest-floor-permits"), ttl), 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    client.release(&permit).await.unwrap();
    holder.release(&held).await.unwrap();
    let waited = tokio::time::timeout(scaled(Duration::from_secs(10)), waiting)
        .await
        .expect("the waiter is served")
        .unwrap()
        .unwrap()
        .expect("granted");
    client.release(&waited).await.unwrap();
    for (what, fence) in [
        ("a lock", lock),
        ("a permit", permit.fence()),
        ("a waiter", waited.fence()),
    ] {
        assert!(
            fence > floor && fence.get() <= i64::MAX as u64,
            "{what}: fence {fence} above the largest floor {floor}"
        );
    }
}

/// The procedure with clients that keep running across the restore, cut
/// off from etcd while it is restored and the floor raised (the procedure's
/// "keep the store unreachable"). etcd restores their sessions from the
/// backup, with keys only the backup remembers: here a lock released after
/// the backup was taken, which a client that kept refreshing its session
/// would block for ever. Once the clients see the raise, they resume no
/// session from before it: the released lock is free as soon as the
/// client's locks have moved off the restored session (their next
/// renewal), the locks held throughout are kept with their fences, the
/// waiter keeps its place and is granted above the floor, and every new
/// grant is above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_running_across_a_restore_resume_no_session_from_before_the_floor() {
    use lock_conformance::kit::proxy::{FaultProxy, Mode};
    use lockcore::Locker;
    const TTL: Duration = Duration::from_secs(30);
    let store = private_etcd().await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let running = || async {
        EtcdBackend::connect_with(
            lock_etcd::EtcdConfig::new([store.endpoint_via(proxy.addr())])
                .request_timeout(scaled(Duration::from_secs(1))),
        )
        .await
        .unwrap()
    };
    let (a, b) = (running().await, running().await);
    let renew_every = scaled(Duration::from_secs(2));
    let locker = |backend: &EtcdBackend| {
        Locker::new(backend.clone())
            .ttl(TTL)
            .renew_every(renew_every)
    };
    let (locker_a, locker_b) = (locker(&a), locker(&b));
    let (held, queued, released) = (name("held"), name("queued"), name("released-since"));
    // `a` holds a lock, and waits in line for one `b` holds.
    let held_a = locker_a.acquire(&held).await.unwrap();
    let held_b = locker_b.acquire(&queued).await.unwrap();
    let waiting = {
        let (locker_a, queued) = (locker_a.clone(), queued.clone());
        tokio::spawn(async move {
            locker_a
                .acquire_timeout(&queued, scaled(Duration::from_secs(90)))
                .await
        })
    };
    let mut raw = raw(&store.endpoint()).await;
    let queue = queue_of(&held_b.lease());
    until(scaled(Duration::from_secs(10)), "a in line", || {
        let (mut raw, queue) = (raw.clone(), queue.clone());
        async move { queue_len(&mut raw, queue).await == 2 }
    })
    .await;
    let held_key = key_of(&held_a.lease()).unwrap();
    let restored_session = etcd_lease_of(&mut raw, &held_key).await;
    // A lock `a` holds when the backup is taken and releases right after.
    let gone_since = acquire(&a, &released, TTL).await;

    let backup = tempfile::tempdir().unwrap();
    let snapshot = backup.path().join("snapshot.db");
    {
        let (store, snapshot) = (&store, snapshot.clone());
        tokio::task::block_in_place(|| etcd::snapshot(store, &snapshot)).expect("snapshot");
    }
    a.release(&gone_since).await.unwrap();
    // History the restore loses: the resources saw these fences.
    let highest = cycles(&connect(&store.endpoint()).await, &name("lost-history"), 5).await;

    proxy.set(Mode::Blackhole);
    tokio::task::block_in_place(|| etcd::restore(&store, &snapshot)).expect("restore");
    let admin = connect(&store.endpoint()).await;
    admin.raise_fence_floor(highest).await.unwrap();
    let raised = Instant::now();
    proxy.set(Mode::Pass);
    proxy.reset_existing();

    // Long before the TTL: the restored session is revoked once `a`'s locks
    // moved off it (at their next renewal), its waiter's entry at once.
    let within = renew_every * 2 + scaled(Duration::from_secs(5));
    let next = lock_conformance::kit::poll::eventually(
        within,
        "the lock released after the backup free",
        || async {
            admin
                .try_acquire_for(&released, TTL)
                .await
                .ok()?
                .into_lease()
        },
    )
    .await;
    eprintln!(
        "the lock only the backup remembered free {:?} after the raise",
        raised.elapsed()
    );
    let mut raw = raw.clone();
    let moved = etcd_lease_of(&mut raw, &held_key).await;
    assert_ne!(
        moved, restored_session,
        "a's lock is still on the restored session"
    );
    for (who, guard) in [("a", &held_a), ("b", &held_b)] {
        assert!(guard.is_held(), "{who}'s lock held throughout was lost");
        let seen = admin.inspect(guard.lease().name()).await.unwrap();
        assert_eq!(
            seen.map(|h| h.fence),
            Some(guard.fencing_token()),
            "{who}'s lock: etcd shows another holder"
        );
    }
    held_b.release().await.unwrap();
    let waited = tokio::time::timeout(scaled(Duration::from_secs(10)), waiting)
        .await
        .expect("a's waiter served once b released")
        .unwrap()
        .expect("granted");
    let again = cycles(&b, &name("after"), 1).await;
    for (what, fence) in [
        ("the name released after the backup", next.fence()),
        ("a's waiter", waited.fencing_token()),
        ("a new lock of a running client", again),
    ] {
        assert!(
            fence > highest,
            "{what}: fence {fence} not above the floor {highest}"
        );
    }
    admin.release(&next).await.unwrap();
    waited.release().await.unwrap();
    held_a.release().await.unwrap();
}

/// A raise puts and deletes a marker in each queue with waiters, so every
/// waiting client reads the new offset on its queue's own watch, in order
/// with the deletes that hand the lock on (its watch of the floor key is
/// another channel, read by another task). A queue with its holder alone
/// gets none: nobody waits there to be told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_marks_each_queue_with_waiters_and_no_other() {
    use lock_etcd::etcd_client::{EventType, WatchOptions};
    let store = private_etcd().await;
    let (holder, waiter, client) = (
        connect(&store.endpoint()).await,
        connect(&store.endpoint()).await,
        connect(&store.endpoint()).await,
    );
    let (queued, alone) = (name("marked"), name("unmarked"));
    let held = acquire(&holder, &queued, TTL).await;
    let solo = acquire(&holder, &alone, TTL).await;
    let mut raw = raw(&store.endpoint()).await;
    let waiting = queue_a_waiter(&waiter, &queued, &held, &raw).await;
    let (marked, unmarked) = (queue_of(&held), queue_of(&solo));

    let from = revision(&mut raw).await + 1;
    let floor = FencingToken::new(1_000_000).unwrap();
    client.raise_fence_floor(floor).await.unwrap();
    // Everything the raise wrote comes before this put in the watch.
    let end = format!("distlock/~end-{:08x}", rand_u32()).into_bytes();
    raw.put(end.clone(), "", None).await.unwrap();
    let since = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut events = raw.watch("distlock/", Some(since)).await.unwrap();
    let mut seen = Vec::new();
    'read: loop {
        let reply = tokio::time::timeout(scaled(Duration::from_secs(10)), events.message())
            .await
            .expect("the watch reaches the end marker")
            .unwrap()
            .expect("the watch goes on");
        for event in reply.events() {
            let key = event.kv().map(|kv| kv.key().to_vec()).unwrap_or_default();
            if key == end {
                break 'read;
            }
            seen.push((event.event_type(), key));
        }
    }
    // (The waiter may already have rewritten its entry with the new offset,
    // as it must before it is granted: only the markers are counted.)
    let marker = [marked.as_slice(), b"~floor.1000000"].concat();
    assert_eq!(
        seen.iter()
            .filter(|(_, key)| key.starts_with(&marked) && key.contains(&b'~'))
            .cloned()
            .collect::<Vec<_>>(),
        [
            (EventType::Put, marker.clone()),
            (EventType::Delete, marker)
        ],
        "the queue with a waiter: its marker put, then deleted"
    );
    assert!(
        !seen.iter().any(|(_, key)| key.starts_with(&unmarked)),
        "the queue with its holder alone was written to: {seen:?}"
    );
    holder.release(&held).await.unwrap();
    let waited = tokio::time::timeout(scaled(Duration::from_secs(10)), waiting)
        .await
        .expect("the waiter is served")
        .unwrap()
        .unwrap()
        .expect("granted");
    assert!(
        waited.fence() > floor,
        "{} after the floor {floor}",
        waited.fence()
    );
    holder.release(&solo).await.unwrap();
    waiter.release(&waited).await.unwrap();
}

/// A client whose write is refused for a raise it has not heard of yet
/// (its watch of the floor is late: the link's replies are delayed, and the
/// write leaves before the raise's event arrives) writes again with the
/// offset the refusal taught it, at once: a free name is granted on the
/// first `try_acquire`, above the floor, never answered "held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_for_a_raise_is_made_again_at_once() {
    use lock_conformance::kit::proxy::{FaultProxy, Mode};
    let store = private_etcd().await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = connect(&store.endpoint_via(proxy.addr())).await;
    let raiser = connect(&store.endpoint()).await;
    // The client has a session, and has written under the offset it knows.
    cycles(&client, &name("before-the-raise"), 1).await;
    proxy.set(Mode::DelayDownstream {
        base: scaled(Duration::from_millis(300)),
        jitter: Duration::ZERO,
    });
    let floor = FencingToken::new(1_000_000).unwrap();
    raiser.raise_fence_floor(floor).await.unwrap();
    let lease = acquire(&client, &name("after-the-raise"), TTL).await;
    assert!(
        lease.fence() > floor,
        "{} after the floor {floor}",
        lease.fence()
    );
    proxy.set(Mode::Pass);
    client.release(&lease).await.unwrap();
}
