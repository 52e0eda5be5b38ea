//! Closing a client: every lease it granted is lost at once, the clean-ups
//! it owes the store (a waiter's place in line, an acquire or a permit whose
//! reply was lost) are done before `close` returns, its connections are
//! closed, and later calls fail with `Unavailable`. Dropping the last handle
//! loses its leases too. Each case looks at the store's own view.

use lockcore::backend::Kind;
use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_conformance::kit::until;
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, FencingToken, Lease, LockBackend, LockError, LockName, Locker};

/// The connections the server has open, the observer's own left out.
async fn other_clients(observer: &redis::aio::MultiplexedConnection) -> Vec<String> {
    let mut con = observer.clone();
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut con)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut con)
        .await
        .unwrap();
    list.lines()
        .filter(|line| !line.starts_with(&format!("id={me} ")))
        .map(str::to_owned)
        .collect()
}

/// Channels anyone is subscribed to.
async fn channels(observer: &redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut observer.clone())
        .await
        .unwrap()
}

fn request(backend: &RedisBackend, name: &LockName) -> LockRequest {
    LockRequest::new(
        name.clone(),
        backend.capabilities().effective_ttl(LONG).unwrap(),
    )
}

async fn permit(backend: &RedisBackend, name: &LockName) -> Lease {
    match backend
        .try_acquire_permit(&request(backend, name), 2)
        .await
        .unwrap()
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should have a free permit"),
    }
}

/// A lock, a permit, a watch and a wait: `close` fires both leases' loss
/// signals and ends the wait with `Unavailable`; by the time it returns the
/// wait has left the line, the client's subscription has ended and its
/// command connection is closed (its pub/sub socket closes within a round
/// trip); every later call is `Unavailable`, and a second close is harmless
/// and quick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_loses_every_lease_ends_every_connection_and_refuses_later_calls() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let observer = raw(&url).await;
    let backend = RedisBackend::connect(&url).await.unwrap();
    let other = RedisBackend::connect(&url).await.unwrap();
    let (lock, semaphore, busy) = (unique("held"), unique("permits"), unique("busy"));
    let lease = take(&backend, &lock, LONG).await;
    let permit = permit(&backend, &semaphore).await;
    let blocker = take(&other, &busy, LONG).await;
    let _watch = backend.watch(&busy, Kind::Lock).await.unwrap();
    let waiting = tokio::spawn({
        let (backend, busy) = (backend.clone(), busy.clone());
        async move {
            let wait = WaitPolicy::new(tokio::time::Instant::now() + LONG);
            backend.acquire(&request(&backend, &busy), &wait).await
        }
    });
    in_line(&observer, &busy, 1).await;
    assert!(!lease.is_expired() && !permit.is_expired());
    let before = other_clients(&observer).await.len();
    let round = round_trip(&other).await;

    backend.close().await.unwrap();

    assert!(lease.is_expired(), "the lock's lease outlived close");
    assert!(
        lease.loss_signal().is_some_and(|s| s.is_cancelled()),
        "the lock's loss signal did not fire"
    );
    assert!(permit.is_expired(), "the permit outlived close");
    assert_eq!(
        queue_len(&observer, &busy).await,
        0,
        "the wait ended by close is still in line"
    );
    let left = channels(&observer).await;
    assert!(
        left.iter().all(|c| !c.contains("wake:")) && left.len() <= 1,
        "the closed client is still subscribed: {left:?}"
    );
    let waited = tokio::time::timeout(round, waiting)
        .await
        .expect("a wait in progress ends at close")
        .unwrap();
    assert!(
        matches!(waited, Err(LockError::Unavailable { .. })),
        "{waited:?}"
    );
    // `other` has its command and pub/sub connections; the closed client none.
    until(round, "the closed client's connections gone", || async {
        other_clients(&observer).await.len() == 2
    })
    .await;
    assert!(before > 2, "the client had connections of its own");

    let unavailable = |what: &str, outcome: Result<(), LockError>| {
        assert!(
            matches!(outcome, Err(LockError::Unavailable { .. })),
            "{what} after close: {outcome:?}"
        );
    };
    let fresh = unique("after-close");
    unavailable(
        "try_acquire",
        backend.try_acquire_for(&fresh, LONG).await.map(drop),
    );
    unavailable("renew", backend.renew(&lease).await.map(drop));
    unavailable(
        "renew_many",
        backend
            .renew_many(std::slice::from_ref(&permit))
            .await
            .remove(0)
            .map(drop),
    );
    unavailable("release", backend.release(&lease).await.map(drop));
    unavailable("inspect", backend.inspect(&lock).await.map(drop));
    unavailable("evict", backend.evict(&lock, None).await.map(drop));
    unavailable("watch", backend.watch(&lock, Kind::Lock).await.map(drop));
    unavailable(
        "acquire",
        backend
            .acquire_for(
                &fresh,
                LONG,
                &WaitPolicy::new(tokio::time::Instant::now() + LONG),
            )
            .await
            .map(drop),
    );
    unavailable(
        "try_acquire_permit",
        backend
            .try_acquire_permit(&request(&backend, &semaphore), 2)
            .await
            .map(drop),
    );
    unavailable(
        "inspect_permits",
        backend.inspect_permits(&semaphore).await.map(drop),
    );
    unavailable(
        "raise_fence_floor",
        backend
            .raise_fence_floor(FencingToken::new(1).unwrap())
            .await,
    );
    let again = tokio::time::Instant::now();
    backend.close().await.unwrap();
    assert!(again.elapsed() < round, "a second close waits for nothing");
    assert_eq!(other_clients(&observer).await.len(), 2);
    other.release(&blocker).await.unwrap();
}

/// A waiter that timed out, on a slow link, whose client is closed at once
/// (a CLI giving up, then exiting): when `close` returns, its place in line
/// is gone from the store, and the holder's release hands the lock to
/// nobody but whoever asks next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_closed_at_once_leaves_nothing_in_line() {
    let store = launcher::shared();
    let observer = raw(&store.url()).await;
    let holder = RedisBackend::connect(&store.url()).await.unwrap();
    let lock = unique("closed-waiter");
    let lease = take(&holder, &lock, LONG).await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let config = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(Duration::from_secs(2));
    let waiter = Locker::new(RedisBackend::connect_with(config).await.unwrap()).ttl(LONG);
    let waiting = tokio::spawn({
        let (waiter, lock) = (waiter.clone(), lock.clone());
        async move { waiter.acquire_timeout(&lock, Duration::from_secs(3)).await }
    });
    in_line(&observer, &lock, 1).await;
    // Leaving the line now takes two 250 ms hops.
    proxy.set(Mode::Delay {
        base: Duration::from_millis(250),
        jitter: Duration::ZERO,
    });
    let outcome = waiting.await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "{outcome:?}"
    );
    waiter.close().await.unwrap();
    assert_eq!(
        queue_len(&observer, &lock).await,
        0,
        "the closed waiter is still in line"
    );
    let next: Option<String> = observer
        .clone()
        .get(format!("distlock:{{{}}}:next", lock.as_str()))
        .await
        .unwrap();
    assert_eq!(next, None, "a hand-off is reserved for the closed waiter");
    holder.release(&lease).await.unwrap();
    let again = take(&holder, &lock, LONG).await;
    holder.release(&again).await.unwrap();
}

/// An acquire and a permit whose replies were lost, undone by clean-ups that
/// retry until the link heals (the link drops replies while the requests
/// run, then swallows everything): a client closed right after the link
/// heals has undone both by the time `close` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_finishes_undoing_grants_whose_reply_was_lost() {
    let store = launcher::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let config = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_millis(300));
    let cut = RedisBackend::connect_with(config).await.unwrap();
    let direct = RedisBackend::connect(&store.url()).await.unwrap();
    let (lock, semaphore) = (unique("lost-lock"), unique("lost-permit"));
    // Load the scripts first, so the lost requests really run on the server.
    let warm = take(&cut, &lock, LONG).await;
    cut.release(&warm).await.unwrap();
    let warm = permit(&cut, &semaphore).await;
    cut.release(&warm).await.unwrap();

    proxy.set(Mode::DropDownstream);
    let lost_lock = tokio::spawn({
        let (cut, lock) = (cut.clone(), lock.clone());
        async move { cut.try_acquire_for(&lock, LONG).await }
    });
    let lost_permit = tokio::spawn({
        let (cut, semaphore) = (cut.clone(), semaphore.clone());
        async move { cut.try_acquire_permit(&request(&cut, &semaphore), 2).await }
    });
    until(
        Duration::from_secs(1),
        "both requests run on the server",
        || async {
            direct.inspect(&lock).await.unwrap().is_some()
                && !direct.inspect_permits(&semaphore).await.unwrap().is_empty()
        },
    )
    .await;
    // Nothing reaches the server any more: the clean-ups retry.
    proxy.set(Mode::Blackhole);
    let lost = lost_lock.await.unwrap();
    assert!(matches!(&lost, Err(e) if e.is_retryable()), "{lost:?}");
    let lost = lost_permit.await.unwrap();
    assert!(matches!(&lost, Err(e) if e.is_retryable()), "{lost:?}");
    assert!(direct.inspect(&lock).await.unwrap().is_some());
    assert!(!direct.inspect_permits(&semaphore).await.unwrap().is_empty());

    proxy.set(Mode::Pass);
    cut.close().await.unwrap();
    assert_eq!(
        direct.inspect(&lock).await.unwrap(),
        None,
        "the lock of a lost reply outlived close"
    );
    assert_eq!(
        direct.inspect_permits(&semaphore).await.unwrap(),
        vec![],
        "the permit of a lost reply outlived close"
    );
}

/// Dropping every handle of a backend loses its leases at once: nothing is
/// left to renew them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_backend_loses_its_leases() {
    let backend = RedisBackend::connect(&launcher::shared().url())
        .await
        .unwrap();
    let lease = take(&backend, &unique("dropped"), LONG).await;
    let permit = permit(&backend, &unique("dropped-permits")).await;
    drop(backend);
    assert!(lease.is_expired(), "a lease outlived its dropped backend");
    assert!(permit.is_expired(), "a permit outlived its dropped backend");
}
