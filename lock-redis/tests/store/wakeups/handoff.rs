//! Hand-off grants: a release grants the free lock to the head of the line
//! in the same script, on the waiter's standing offer; the waiter's lease
//! counts from its own proof, dead heads are skipped, a stale offer falls
//! back to a reservation, and a waiter gone at the hand-off passes it on.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_conformance::kit::until;
use lock_redis::redis::AsyncCommands;
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::{LockBackend, LockGuard, LockName, Locker, OwnerToken, ReleaseOutcome};
use tokio::task::JoinHandle;
use tokio::time::Instant;

fn lock_key(lock: &LockName) -> String {
    format!("distlock:{{{}}}", lock.as_str())
}

fn offers_key(lock: &LockName) -> String {
    format!("{}:offers", lock_key(lock))
}

/// Scripts the server ran (`EVALSHA` and `EVAL`).
async fn scripts_run(con: &lock_redis::redis::aio::MultiplexedConnection) -> u64 {
    command_calls(con, "evalsha").await + command_calls(con, "eval").await
}

/// A patient waiter on `backend` waiting for `lock`, once it is `nth` in line.
async fn waiting(
    backend: RedisBackend,
    con: &lock_redis::redis::aio::MultiplexedConnection,
    lock: &LockName,
    nth: usize,
) -> JoinHandle<LockGuard> {
    let locker = patient(backend);
    let task = tokio::spawn({
        let lock = lock.clone();
        async move { locker.acquire(&lock).await.unwrap() }
    });
    in_line(con, lock, nth).await;
    task
}

/// Loads the scripts of a wait into the server's cache (a take, a wait that
/// times out and leaves, a release), so that no script counted or delayed
/// by a test is sent twice (`NOSCRIPT`, then its text).
async fn warm_scripts(url: &str, con: &lock_redis::redis::aio::MultiplexedConnection) {
    let backend = RedisBackend::connect(url).await.unwrap();
    let lock = unique("warm");
    let lease = take(&backend, &lock, LONG).await;
    let timed_out = Locker::new(backend.clone())
        .ttl(LONG)
        .acquire_timeout(&lock, Duration::from_millis(50))
        .await;
    assert!(timed_out.is_err());
    until(
        scaled(Duration::from_secs(10)),
        "the timed-out wait left",
        || async { queue_len(con, &lock).await == 0 },
    )
    .await;
    backend.release(&lease).await.unwrap();
}

/// A backend of `store` through a fresh fault proxy, patient enough (10 s
/// replies) that a delayed link is slow, not lost.
async fn through_proxy(store: &Store) -> (FaultProxy, RedisBackend) {
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(scaled(Duration::from_secs(10)))
        .connect_timeout(scaled(Duration::from_secs(10)));
    (proxy, RedisBackend::connect_with(via).await.unwrap())
}

/// Right after `release` returns, the lock already holds the waiter's
/// owner under a larger fence; the waiter's guard arrives with that fence
/// and it sent no acquire of its own: the release is the only script run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_head_in_the_same_script() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let con = raw(&url).await;
    warm_scripts(&url, &con).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = unique("handoff");
    let lease = take(&holder, &lock, LONG).await;
    let waiter = waiting(RedisBackend::connect(&url).await.unwrap(), &con, &lock, 1).await;

    let before = scripts_run(&con).await;
    holder.release(&lease).await.unwrap();
    let value: Option<String> = con.clone().get(lock_key(&lock)).await.unwrap();
    let value = value.expect("the lock is the waiter's as the release returns");
    let guard = waiter.await.unwrap();
    assert_eq!(
        scripts_run(&con).await - before,
        1,
        "the release alone: the waiter sent no acquire"
    );
    let handed = guard.lease();
    assert!(guard.fencing_token() > lease.fence());
    assert_eq!(
        value.split(' ').next().unwrap(),
        format!("{}:{}", handed.owner().encode(), guard.fencing_token())
    );
    let leftovers: i64 = con
        .clone()
        .exists(&[queue_key(&lock), offers_key(&lock)])
        .await
        .unwrap();
    assert_eq!(leftovers, 0, "line and offers gone with the hand-off");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// The hand-off message is held up on its way (the waiter's link delays
/// everything the store sends). The lease counts from the waiter's own
/// send of the attempt whose offer was used, so what it believes it has
/// left never exceeds what the store has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_lease_counts_from_the_proof_not_the_message() {
    let store = launcher::shared();
    let con = raw(&store.url()).await;
    let holder = RedisBackend::connect(&store.url()).await.unwrap();
    let lock = unique("handoff-late");
    let lease = take(&holder, &lock, LONG).await;
    let (proxy, backend) = through_proxy(&store).await;
    let waiter = waiting(backend, &con, &lock, 1).await;

    let late = scaled(Duration::from_millis(1500));
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    holder.release(&lease).await.unwrap();
    let guard = waiter.await.unwrap();
    let remaining = guard.lease().remaining();
    let pttl: i64 = con.clone().pttl(lock_key(&lock)).await.unwrap();
    let store_left = Duration::from_millis(u64::try_from(pttl).unwrap());
    assert!(
        LONG - store_left >= late,
        "the message was late: the store's TTL ran down meanwhile ({store_left:?} left)"
    );
    assert!(
        remaining <= store_left,
        "the lease believes {remaining:?} left, the store has {store_left:?}"
    );
    proxy.set(Mode::Pass);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// The head of the line is gone (its entry and a fresh offer stand, but
/// nobody listens on its channel): the release skips it at once and grants
/// the next waiter, not a TTL later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_is_skipped_and_the_next_gets_the_name() {
    let url = launcher::shared().url();
    let mut con = raw(&url).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = unique("handoff-dead");
    let lease = take(&holder, &lock, LONG).await;
    let dead = format!("1:1000:distlock:wake:gone-{:x}", rand_u64());
    let now_ms = server_micros(&mut con).await / 1000;
    let offer = format!(
        "{} 60000 1 {} ",
        now_ms + 60_000,
        OwnerToken::new().encode()
    );
    let () = con.hset(offers_key(&lock), &dead, offer).await.unwrap();
    let () = con.zadd(queue_key(&lock), &dead, -1).await.unwrap();
    let next = waiting(RedisBackend::connect(&url).await.unwrap(), &con, &lock, 2).await;

    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let guard = next.await.unwrap();
    assert!(
        released.elapsed() < scaled(Duration::from_secs(5)),
        "granted at the release, not a TTL later: {:?}",
        released.elapsed()
    );
    assert!(guard.fencing_token() > lease.fence());
    let value: String = con.get(lock_key(&lock)).await.unwrap();
    assert!(
        value.starts_with(&guard.lease().owner().encode()),
        "{value}"
    );
    let dead_offer: Option<String> = con.hget(offers_key(&lock), &dead).await.unwrap();
    assert_eq!(dead_offer, None, "the dead head's offer is dropped");
    guard.release().await.unwrap();
}

/// A waiter's offer has gone stale (less than half its TTL left, as if its
/// last proof were old): the release reserves the lock instead, and the
/// waiter claims it with its own acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_offer_falls_back_to_a_reservation() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let mut con = raw(&url).await;
    warm_scripts(&url, &con).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = unique("handoff-stale");
    let lease = take(&holder, &lock, LONG).await;
    let waiter = waiting(RedisBackend::connect(&url).await.unwrap(), &con, &lock, 1).await;
    let offers: HashMap<String, String> = con.hgetall(offers_key(&lock)).await.unwrap();
    assert_eq!(offers.len(), 1, "{offers:?}");
    let (member, offer) = offers.into_iter().next().unwrap();
    let (_expires_at, rest) = offer.split_once(' ').unwrap();
    let now_ms = server_micros(&mut con).await / 1000;
    let stale = format!("{} {rest}", now_ms + 1_000);
    let () = con.hset(offers_key(&lock), &member, stale).await.unwrap();

    let before = scripts_run(&con).await;
    holder.release(&lease).await.unwrap();
    let guard = waiter.await.unwrap();
    assert_eq!(
        scripts_run(&con).await - before,
        2,
        "the release, then the waiter's claim"
    );
    assert!(guard.fencing_token() > lease.fence());
    let pttl: i64 = con.pttl(lock_key(&lock)).await.unwrap();
    assert!(pttl > 30_000, "claimed with its own full TTL: {pttl}");
    guard.release().await.unwrap();
}

/// The head is granted the lock, but its wait is dropped before the
/// (delayed) message reaches it: the dropped wait frees the name and hands
/// it on, so the next waiter has it at once, not a TTL later; the late
/// message, handed back, frees nothing of the next holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_at_the_hand_off_passes_the_name_on() {
    let store = private(Options::durable()).await;
    let con = raw(&store.url()).await;
    warm_scripts(&store.url(), &con).await;
    let holder = RedisBackend::connect(&store.url()).await.unwrap();
    let lock = unique("handoff-dropped");
    let lease = take(&holder, &lock, LONG).await;
    let (proxy, backend) = through_proxy(&store).await;
    let first = waiting(backend.clone(), &con, &lock, 1).await;
    let second = waiting(
        RedisBackend::connect(&store.url()).await.unwrap(),
        &con,
        &lock,
        2,
    )
    .await;

    let late = scaled(Duration::from_secs(2));
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    let before = scripts_run(&con).await;
    holder.release(&lease).await.unwrap();
    let value: Option<String> = con.clone().get(lock_key(&lock)).await.unwrap();
    let first_grant = value.expect("granted to the first waiter");
    let dropped = Instant::now();
    first.abort();
    let guard = second.await.unwrap();
    assert!(
        dropped.elapsed() < late,
        "passed on by the dropped wait, before its message even arrived: {:?}",
        dropped.elapsed()
    );
    assert!(!first_grant.starts_with(&guard.lease().owner().encode()));
    // The first instance's late message comes back as an orphan and is
    // passed on (one more leave script): it must leave this grant alone.
    until(
        scaled(Duration::from_secs(10)),
        "the late message was handled",
        || async { scripts_run(&con).await >= before + 3 },
    )
    .await;
    assert!(guard.is_held());
    let value: String = con.clone().get(lock_key(&lock)).await.unwrap();
    assert!(
        value.starts_with(&guard.lease().owner().encode()),
        "{value}"
    );
    proxy.set(Mode::Pass);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    drop(backend);
}

/// A hand-off whose message never arrives (as after a subscription
/// reconnect): the waiter's next attempt, due within a third of its TTL,
/// finds the lock its owner's and takes it, its lease ending no later than
/// the store's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_whose_message_is_lost_is_taken_by_the_next_attempt() {
    let url = launcher::shared().url();
    let mut con = raw(&url).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = unique("handoff-lost");
    let lease = take(&holder, &lock, LONG).await;
    let ttl = scaled(Duration::from_secs(3));
    let locker = patient(RedisBackend::connect(&url).await.unwrap()).ttl(ttl);
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { locker.acquire(&lock).await.unwrap() }
    });
    in_line(&con, &lock, 1).await;
    let offers: HashMap<String, String> = con.hgetall(offers_key(&lock)).await.unwrap();
    let (member, offer) = offers.into_iter().next().unwrap();
    let owner = offer.split(' ').nth(3).unwrap().to_owned();
    // The release's hand-off, without its message.
    let fence = server_micros(&mut con).await;
    let () = lock_redis::redis::pipe()
        .atomic()
        .del(lock_key(&lock))
        .ignore()
        .zrem(queue_key(&lock), &member)
        .ignore()
        .hdel(offers_key(&lock), &member)
        .ignore()
        .cmd("SET")
        .arg(lock_key(&lock))
        .arg(format!("{owner}:{fence} label"))
        .arg("PX")
        .arg(u64::try_from(ttl.as_millis()).unwrap())
        .ignore()
        .query_async(&mut con)
        .await
        .unwrap();
    let guard = tokio::time::timeout(ttl, waiter)
        .await
        .expect("taken at the next attempt, within a third of the TTL")
        .unwrap();
    let remaining = guard.lease().remaining();
    let pttl: i64 = con.pttl(lock_key(&lock)).await.unwrap();
    assert_eq!(guard.fencing_token().get(), fence);
    assert!(
        remaining <= Duration::from_millis(u64::try_from(pttl).unwrap()),
        "the lease believes {remaining:?} left, the store has {pttl} ms"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    drop(lease);
}
