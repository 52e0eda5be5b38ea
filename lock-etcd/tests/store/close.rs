//! Closing a client, and dropping one: nothing it granted reads held
//! afterwards, nothing it wrote blocks anyone (etcd's own view: the queue's
//! entries, the leases left), and its connection is gone. Except a grant
//! whose remaining time it set: etcd keeps that one for exactly that long.

use std::collections::HashSet;
use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::{self, etcd};
use lock_etcd::etcd_client::Client;
use lock_etcd::testing::{key_of, sessions, watched};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, LockBackend, LockError, Locker};
use tokio::time::Instant;

use crate::support::*;

/// As `distlock run`'s default.
const TTL: Duration = Duration::from_secs(30);

/// The leases etcd has with `TTL` (sessions of clients of this TTL).
async fn sessions_in(raw: &mut Client) -> HashSet<i64> {
    let mut found = HashSet::new();
    for lease in raw.leases().await.unwrap().leases() {
        let ttl = raw.lease_time_to_live(lease.id(), None).await.unwrap();
        if ttl.granted_ttl() == TTL.as_secs() as i64 {
            found.insert(lease.id());
        }
    }
    found
}

/// A waiter whose wait timed out, in a process that closes its client and
/// exits at once (here: a runtime of its own, dropped once it returns, with
/// every task it still had), leaves nothing in etcd: the queue holds only
/// the holder's entry, no session of the waiter is left, and the name is
/// free the moment the holder releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_timed_out_and_exits_at_once_leaves_nothing() {
    let store = private_etcd().await;
    let url = store.endpoint();
    let (holder, next) = (connect(&url).await, connect(&url).await);
    let mut raw = raw(&url).await;
    let lock = name("exits");
    let held = acquire(&holder, &lock, TTL).await;
    let queue = queue_of(&held);
    let before = sessions_in(&mut raw).await;
    let wait = scaled(Duration::from_millis(200));
    let (waiter_url, waiter_lock) = (url.clone(), lock.clone());
    let waited = std::thread::spawn(move || {
        let process = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        process.block_on(async move {
            let locker = Locker::new(connect(&waiter_url).await).ttl(TTL);
            let outcome = locker.acquire_timeout(&waiter_lock, wait).await;
            locker.close().await.expect("close");
            outcome.map(drop)
        })
    })
    .join()
    .unwrap();
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    let entries = queue_len(&mut raw, queue).await;
    assert_eq!(
        entries, 1,
        "the queue holds {entries} entries, not only the holder's"
    );
    let left: Vec<i64> = sessions_in(&mut raw)
        .await
        .difference(&before)
        .copied()
        .collect();
    assert!(left.is_empty(), "the waiter's sessions are left: {left:x?}");
    holder.release(&held).await.unwrap();
    let taken = next.try_acquire_for(&lock, TTL).await.unwrap();
    let Attempt::Acquired(lease) = taken else {
        panic!("the name is not free after the holder released it: {taken:?}");
    };
    next.release(&lease).await.unwrap();
}

/// `close` fires the loss signal of every grant (a lock, a permit, a guard
/// of a `Locker` on it), removes every entry of the client from etcd at once
/// (held, waiting, a cancelled waiter's), ends its watch stream and closes
/// its connection before it returns; later calls are `Unavailable`, and a
/// second close changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_loses_and_removes_everything_and_closes_the_connection() {
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = EtcdBackend::connect_with(EtcdConfig::new([store.endpoint_via(proxy.addr())]))
        .await
        .unwrap();
    let other = connect(&store.endpoint()).await;
    let mut raw = raw(&store.endpoint()).await;
    let (lock, guarded, contended, cancelled, semaphore) = (
        name("close-lock"),
        name("close-guarded"),
        name("close-waiting"),
        name("close-cancelled"),
        name("close-permits"),
    );
    let lease = acquire(&client, &lock, TTL).await;
    let guard = Locker::new(client.clone())
        .ttl(TTL)
        .acquire(&guarded)
        .await
        .unwrap();
    let ttl = client.capabilities().effective_ttl(TTL).unwrap();
    let permit = client
        .try_acquire_permit(&LockRequest::new(semaphore.clone(), ttl), 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    // A waiter in line when the client closes, and one that gave up.
    let (first, second) = (
        acquire(&other, &contended, TTL).await,
        acquire(&other, &cancelled, TTL).await,
    );
    let waiting = {
        let client = client.clone();
        let contended = contended.clone();
        tokio::spawn(async move {
            let wait = WaitPolicy::new(Instant::now() + scaled(Duration::from_secs(30)));
            client.acquire_for(&contended, TTL, &wait).await
        })
    };
    let gave_up = tokio::time::timeout(scaled(Duration::from_millis(300)), async {
        let wait = WaitPolicy::new(Instant::now() + scaled(Duration::from_secs(30)));
        client.acquire_for(&cancelled, TTL, &wait).await
    })
    .await;
    assert!(gave_up.is_err(), "the wait should have been cancelled");
    let queues = [queue_of(&first), queue_of(&second)];
    until(scaled(Duration::from_secs(5)), "the waiter in line", || {
        let (mut raw, queue) = (raw.clone(), queues[0].clone());
        async move { queue_len(&mut raw, queue).await == 2 }
    })
    .await;
    assert!(proxy.connections() > 0 && watched(&client) > 0 && sessions(&client) > 0);

    client.close().await.expect("close");
    for (what, lease) in [("a lock", &lease), ("a permit", &permit)] {
        assert!(lease.is_expired(), "{what} still reads held after close");
    }
    assert!(!guard.is_held(), "a guard still reads held after close");
    for name in [&lock, &guarded] {
        let next = acquire(&other, name, TTL).await;
        other.release(&next).await.unwrap();
    }
    let slots = other
        .try_acquire_permit(&LockRequest::new(semaphore.clone(), ttl), 1)
        .await
        .unwrap();
    let Attempt::Acquired(slot) = slots else {
        panic!("the closed client's permit is still taken: {slots:?}");
    };
    other.release(&slot).await.unwrap();
    for queue in &queues {
        let entries = queue_len(&mut raw, queue.clone()).await;
        assert_eq!(entries, 1, "the closed client left entries in {queue:?}");
    }
    assert_eq!((sessions(&client), watched(&client)), (0, 0));
    until(
        scaled(Duration::from_secs(1)),
        "the closed client's connection closed",
        || async { proxy.connections() == 0 },
    )
    .await;

    let refused = [
        client.try_acquire_for(&lock, TTL).await.map(drop),
        client.renew(&lease).await.map(drop),
        client.release(&lease).await.map(drop),
        client.inspect(&lock).await.map(drop),
        client.client().map(drop),
    ];
    for outcome in refused {
        assert!(
            matches!(outcome, Err(LockError::Unavailable { .. })),
            "a closed client must refuse work with Unavailable: {outcome:?}"
        );
    }
    client.close().await.expect("a second close");
    waiting.abort();
    other.release(&first).await.unwrap();
    other.release(&second).await.unwrap();
    drop(guard);
}

/// A backend dropped without `close` (every clone): its grants read lost at
/// once (nothing can renew them), its background tasks end and its
/// connection closes; its keys go with their sessions, within the TTL and
/// the declared slack (a holder may still act on a lease until its deadline,
/// so nothing is revoked early).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_loses_its_grants_and_closes_its_connection() {
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = EtcdBackend::connect_with(EtcdConfig::new([store.endpoint_via(proxy.addr())]))
        .await
        .unwrap();
    let other = connect(&store.endpoint()).await;
    // Longer than the time the connection is given to close.
    let ttl = Duration::from_secs(5);
    let lock = name("dropped");
    let lease = acquire(&client, &lock, ttl).await;
    // Its session's notices are followed on the watch stream.
    until(
        scaled(Duration::from_secs(2)),
        "the notices watched",
        || async { watched(&client) > 0 },
    )
    .await;
    drop(client);
    assert!(
        lease.is_expired(),
        "a lease of a dropped backend reads held"
    );
    until(
        scaled(Duration::from_secs(2)),
        "the dropped backend's connection closed",
        || async { proxy.connections() == 0 },
    )
    .await;
    let within = ttl + other.capabilities().slack_for(ttl) + scaled(Duration::from_secs(1));
    let next = lock_conformance::kit::poll::eventually(
        within,
        "the dropped backend's lock free within TTL + slack",
        || async { other.try_acquire_for(&lock, ttl).await.ok()?.into_lease() },
    )
    .await;
    other.release(&next).await.unwrap();
}

/// A grant whose remaining time was set (`set_remaining`, what a job's
/// `at_least` is made of) is on an etcd lease of its own, of that time in
/// whole seconds: closing its client (which revokes the client's sessions)
/// leaves it taken, and it is freed no sooner than the time set after the
/// call was sent and within the declared TTL bound of it (granularity,
/// slack, a round trip) after the call returned. A waiter in line is woken
/// by its expiry (re-checks alone would come too late), and gets a larger
/// fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_remaining_time_was_set_outlives_its_closed_client() {
    let url = etcd::shared().endpoint();
    let (client, other) = (connect(&url).await, connect(&url).await);
    let mut raw = raw(&url).await;
    let lock = name("kept");
    let lease = acquire(&client, &lock, TTL).await;
    let key = lock_etcd::testing::key_of(&lease).unwrap();
    let session = etcd_lease_of(&mut raw, &key).await;
    let caps = client.capabilities();
    let remaining = caps
        .effective_ttl(scaled(Duration::from_secs(3)).max(caps.min_ttl))
        .unwrap();
    let sent = Instant::now();
    let kept = client.set_remaining(&lease, remaining).await.unwrap();
    let returned = Instant::now();
    assert!(kept.same_grant(&lease) && kept.ttl() == remaining);
    let own = etcd_lease_of(&mut raw, &key).await;
    assert_ne!(own, session, "the key is still on its session");
    let granted = raw
        .lease_time_to_live(own, None)
        .await
        .unwrap()
        .granted_ttl();
    assert_eq!(
        granted,
        remaining.as_secs_ceil() as i64,
        "the key's own lease is not of the time set"
    );
    client.close().await.expect("close");
    let taken = other.try_acquire_for(&lock, TTL).await.unwrap();
    assert!(
        matches!(taken, Attempt::Held { .. }),
        "free once its client closed: {taken:?}"
    );
    let holder = other.inspect(&lock).await.unwrap().expect("a holder");
    assert_eq!(holder.fence, lease.fence());
    assert!(
        holder
            .expires_in
            .is_some_and(|left| left <= remaining.get() + caps.ttl_granularity)
    );
    let bound = remaining.get()
        + caps.ttl_granularity
        + caps.slack_for(remaining.get())
        + round_trip(&other).await;
    // Longer than the bound: only the expiry's delete wakes it in time.
    let wait = WaitPolicy::new(returned + bound).recheck(bound * 2);
    let next = other
        .acquire_for(&lock, TTL, &wait)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("not free within {bound:?} of the call's return"));
    let freed = Instant::now();
    assert!(
        freed >= sent + remaining.get(),
        "freed {:?} after the call was sent, before the {remaining} set",
        freed - sent
    );
    assert!(next.fence() > lease.fence());
    eprintln!(
        "a grant set to {remaining} was freed {:?} after the call was sent (etcd's minimum TTL: {:?})",
        freed - sent,
        caps.min_ttl
    );
    other.release(&next).await.unwrap();
}

/// A client through a proxy, and a lock it holds on its session (etcd's
/// lease id).
async fn proxied_holder(store: &stores::Store, test: &str) -> (FaultProxy, EtcdBackend, i64) {
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = EtcdBackend::connect_with(EtcdConfig::new([store.endpoint_via(proxy.addr())]))
        .await
        .unwrap();
    let lease = acquire(&client, &name(test), TTL).await;
    let mut raw = raw(&store.endpoint()).await;
    let session = etcd_lease_of(&mut raw, &key_of(&lease).unwrap()).await;
    (proxy, client, session)
}

/// A session etcd already dropped (revoked behind the client's back; the
/// client hears of it only after `close` began) is gone all the same:
/// `close` says closed, not that a revoke failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_etcd_already_dropped_succeeds() {
    let store = etcd::shared();
    let (proxy, client, session) = proxied_holder(&store, "close-dropped").await;
    proxy.set(Mode::DelayDownstream {
        base: scaled(Duration::from_millis(500)),
        jitter: Duration::ZERO,
    });
    raw(&store.endpoint())
        .await
        .lease_revoke(session)
        .await
        .unwrap();
    let closed = client.close().await;
    assert!(
        closed.is_ok(),
        "closing after etcd dropped the session: {closed:?}"
    );
}

/// A close whose revokes fail (its connection reset) says so: the keys on
/// those sessions live until their TTL runs out, and the caller must know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_whose_revokes_fail_says_so() {
    let store = etcd::shared();
    let (proxy, client, session) = proxied_holder(&store, "close-reset").await;
    proxy.set(Mode::Reset);
    let closed = client.close().await;
    assert!(
        closed
            .as_ref()
            .is_err_and(|e| e.to_string().contains("could not be revoked")),
        "closing over a reset link: {closed:?}"
    );
    let left = raw(&store.endpoint())
        .await
        .lease_time_to_live(session, None)
        .await
        .unwrap()
        .ttl();
    assert!(left > 0, "the session was revoked after all");
}
