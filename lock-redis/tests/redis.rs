//! Redis-specific behaviour, against real `redis-server`s from the suite's
//! launcher: fence durability per persistence setting, the key scheme on the
//! server, TTL caps, the wait line (one subscription per backend, one waiter
//! woken per release in arrival order, wake-ups passed on, gone and hung
//! waiters skipped, cancelled waits leaving the line, recovery after the
//! subscription drops), lost replies, ACLs, and the resource-side fenced
//! write.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::StoreControl;
use lock_conformance::proxy::{FaultProxy, Mode};
use lock_conformance::stores::redis::{self as launcher, Options, Persistence as Stored};
use lock_conformance::stores::{Store, until};
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{Fenced, MAX_TTL, Persistence, RedisBackend, RedisConfig, fenced_apply};
use lockcore::backend::LockBackendExt;
use lockcore::{
    Attempt, Backoff, FencingToken, LockBackend, LockError, LockName, Locker, ReleaseOutcome,
};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(60);

fn unique(what: &str) -> String {
    format!("redis-test/{what}/{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    // Good enough to keep reruns against one server apart.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
}

fn name(what: &str) -> LockName {
    LockName::new(unique(what)).unwrap()
}

async fn private(options: Options) -> Store {
    tokio::task::spawn_blocking(move || launcher::start(options))
        .await
        .expect("launcher thread")
        .expect("redis-server must be installed (apt-get install redis-server)")
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

async fn acquire(backend: &RedisBackend, name: &LockName, ttl: Duration) -> lockcore::Lease {
    match backend
        .try_acquire_for(name, ttl)
        .await
        .expect("try_acquire")
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should be free"),
    }
}

async fn evalsha_calls(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aof_always_keeps_locks_and_fences_across_kill_9() {
    let store = private(Options::durable()).await;
    let backend = RedisBackend::connect(&store.url()).await.unwrap();
    assert_eq!(backend.persistence(), &Persistence::AofAlways);
    let (cycled, held_name) = (name("cycled"), name("held"));
    let mut last = None;
    for _ in 0..20 {
        let lease = acquire(&backend, &cycled, LONG).await;
        assert!(last < Some(lease.fence()));
        last = Some(lease.fence());
        backend.release(&lease).await.unwrap();
    }
    let held = acquire(&backend, &held_name, LONG).await;

    store.kill().await.unwrap();
    store.restart().await.unwrap();

    let after = RedisBackend::connect(&store.url()).await.unwrap();
    let holder = after.inspect(&held_name).await.unwrap();
    assert_eq!(
        holder.map(|h| h.fence),
        Some(held.fence()),
        "with appendfsync always a held lock survives the crash"
    );
    let first = acquire(&after, &cycled, LONG).await;
    assert!(
        Some(first.fence()) > last,
        "F2 across kill -9 with AOF always"
    );
    // The lease from before the crash still renews and releases.
    let renewed = after.renew(&held).await.unwrap();
    assert_eq!(
        after.release(&renewed).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// T3.6b, the documented limit: without persistence a restart forgets every
/// lock (a second holder can be granted while the first still believes it
/// holds, until its next renewal fails) and every counter. Fences still grow,
/// because a lost counter restarts at the server clock in microseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_persistence_forgets_locks_but_fences_still_grow() {
    let store = private(Options::default().persistence(Stored::None)).await;
    let url = store.url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(backend.persistence(), &Persistence::None);
    let refused = RedisBackend::connect_with(
        RedisConfig::from_url(&url)
            .unwrap()
            .require_durable_fences(true),
    )
    .await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig { .. })),
        "{refused:?}"
    );

    let lock = name("forgotten");
    let held = acquire(&backend, &lock, LONG).await;
    store.kill().await.unwrap();
    store.restart().await.unwrap();

    let after = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(
        after.inspect(&lock).await.unwrap(),
        None,
        "the held lock is forgotten"
    );
    let fence_key = format!("distlock:{{{}}}:fence", lock.as_str());
    let counter: Option<String> = raw(&url).await.get(&fence_key).await.unwrap();
    assert_eq!(counter, None, "the fence counter is gone too");
    let second = acquire(&after, &lock, LONG).await;
    assert!(
        second.fence() > held.fence(),
        "the clock floor keeps fences growing: {} after {}",
        second.fence(),
        held.fence()
    );
    // The forgotten holder learns at its next renewal.
    assert!(matches!(
        after.renew(&held).await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(after.release(&held).await.unwrap(), ReleaseOutcome::NotHeld);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_is_read_at_connect() {
    let store = private(Options::default().persistence(Stored::AofEverysec)).await;
    let backend = RedisBackend::connect(&store.url()).await.unwrap();
    assert_eq!(backend.persistence(), &Persistence::AofEverysec);
    assert!(!backend.persistence().is_durable());
}

/// What an `everysec` power loss or an old snapshot does to the counter: it
/// goes back. The next fence is still above every fence issued before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_counter_still_grows() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let lock = name("rolled-back");
    let first = acquire(&backend, &lock, LONG).await;
    backend.release(&first).await.unwrap();
    let fence_key = format!("distlock:{{{}}}:fence", lock.as_str());
    let () = raw(&url).await.set(&fence_key, "5").await.unwrap();
    let second = acquire(&backend, &lock, LONG).await;
    assert!(
        second.fence() > first.fence(),
        "{} after {}",
        second.fence(),
        first.fence()
    );
    backend.release(&second).await.unwrap();
}

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
    let lease = acquire(&backend, &lock, ttl).await;
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
        format!("{}:{}", lease.owner().encode(), lease.fence())
    );
    let pttl: i64 = con.pttl(&lock_key).await.unwrap();
    assert!(pttl > 0 && pttl <= 30_000, "PX must be the TTL: {pttl}");
    let fence: u64 = con.get(format!("{lock_key}:fence")).await.unwrap();
    assert_eq!(fence, lease.fence().get());
    let keys: Vec<String> = con.keys(format!("{prefix}*")).await.unwrap();
    assert_eq!(keys.len(), 2, "one lock key and one fence key: {keys:?}");

    // Another prefix is another namespace.
    let other = RedisBackend::connect_with(
        RedisConfig::from_url(&url)
            .unwrap()
            .key_prefix(format!("u{:x}:", rand_u64())),
    )
    .await
    .unwrap();
    let elsewhere = acquire(&other, &lock, ttl).await;
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
    let lock = name("ttl");
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
    let lease = acquire(&backend, &lock, Duration::from_micros(1_500)).await;
    assert_eq!(
        lease.ttl(),
        Duration::from_millis(2),
        "rounded up to whole ms"
    );
    let lease = loop {
        // A 2 ms lease may already be gone; wait for it and take the name with the longest TTL.
        match backend.try_acquire_for(&lock, MAX_TTL).await.unwrap() {
            Attempt::Acquired(l) => break l,
            Attempt::Held { .. } => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    };
    let pttl: i64 = raw(&url)
        .await
        .pttl(format!("distlock:{{{}}}", lock.as_str()))
        .await
        .unwrap();
    assert!(pttl > MAX_TTL.as_millis() as i64 - 60_000, "{pttl}");
    backend.release(&lease).await.unwrap();
}

fn queue_key(lock: &LockName) -> String {
    format!("distlock:{{{}}}:queue", lock.as_str())
}

async fn queue_len(con: &redis::aio::MultiplexedConnection, lock: &LockName) -> usize {
    con.clone().zcard(queue_key(lock)).await.unwrap()
}

/// The waits in `lock`'s line: at least `n`, within 10 s.
async fn in_line(con: &redis::aio::MultiplexedConnection, lock: &LockName, n: usize) {
    until(Duration::from_secs(10), &format!("{n} in line"), || async {
        queue_len(con, lock).await >= n
    })
    .await;
}

async fn pubsub_clients(con: &redis::aio::MultiplexedConnection) -> usize {
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    clients.lines().count()
}

async fn wake_channels(con: &redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("distlock:wake:*")
        .query_async(&mut con.clone())
        .await
        .unwrap()
}

/// A waiter that only the store can wake: re-checks and backoff are a minute.
fn patient(backend: RedisBackend) -> Locker {
    Locker::new(backend)
        .ttl(LONG)
        .max_wait(Duration::from_secs(60))
        .recheck(Duration::from_secs(60))
        .backoff(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
}

/// One backend, six waits on three names: one pub/sub connection and one
/// channel, whatever the number of waits and names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscription_per_backend_however_many_waits() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let waiter = patient(RedisBackend::connect(&url).await.unwrap());
    let con = raw(&url).await;
    let locks: Vec<LockName> = (0..3).map(|i| name(&format!("bounded-{i}"))).collect();
    let mut leases = Vec::new();
    for lock in &locks {
        leases.push(acquire(&holder, lock, LONG).await);
    }
    let mut tasks = Vec::new();
    for lock in locks.iter().chain(&locks) {
        let (waiter, lock) = (waiter.clone(), lock.clone());
        tasks.push(tokio::spawn(async move {
            waiter.acquire(&lock).await?.release().await
        }));
    }
    for lock in &locks {
        in_line(&con, lock, 2).await;
    }
    assert_eq!(pubsub_clients(&con).await, 2, "one per instance"); // the holder's hears evictions
    let channels = wake_channels(&con).await;
    assert_eq!(channels.len(), 1, "one channel: {channels:?}");
    for lease in &leases {
        holder.release(lease).await.unwrap();
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), ReleaseOutcome::Released);
    }
    for lock in &locks {
        assert_eq!(queue_len(&con, lock).await, 0);
    }
}

/// Five backend instances (five processes, as far as Redis can tell) wait
/// in line. Each release wakes exactly one of them, the one that came
/// first: the lock changes hands five times for one script per release and
/// one per grant, with no losing attempts, in arrival order, with growing
/// fences. The line expires on its own if nobody refreshes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_exactly_one_instance_in_arrival_order() {
    const WAITERS: usize = 5;
    let store = private(Options::durable()).await;
    let url = store.url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = name("wake-one");
    let warm = acquire(&holder, &lock, LONG).await;
    holder.release(&warm).await.unwrap();
    let first = acquire(&holder, &lock, LONG).await;
    let con = raw(&url).await;

    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let locker = patient(RedisBackend::connect(&url).await.unwrap());
        let (waited, order) = (lock.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locker.acquire(&waited).await?;
            order.lock().unwrap().push((i, guard.fencing_token()));
            guard.release().await
        }));
        // Arrival order is the order of joining the line.
        in_line(&con, &lock, i + 1).await;
    }
    assert_eq!(pubsub_clients(&con).await, WAITERS + 1); // + the holder's (evictions)
    let pttl: i64 = con.clone().pttl(queue_key(&lock)).await.unwrap();
    assert!(
        pttl > 0 && pttl <= 63_000,
        "the line lives for one re-check + the operation timeout unless refreshed: {pttl}"
    );

    let mut stats = con.clone();
    let before = evalsha_calls(&mut stats).await;
    let started = Instant::now();
    holder.release(&first).await.unwrap();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), ReleaseOutcome::Released);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "woken by the store, not the 60 s re-check"
    );
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order.iter().map(|o| o.0).collect::<Vec<_>>(),
        (0..WAITERS).collect::<Vec<_>>(),
        "first come, first served"
    );
    assert!(order[0].1 > first.fence());
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1));
    let calls = evalsha_calls(&mut stats).await - before;
    assert_eq!(
        calls,
        (1 + WAITERS * 2) as u64,
        "one release + {WAITERS} grants + {WAITERS} releases; more means a release woke more than one waiter"
    );
    let leftovers: i64 = con
        .clone()
        .exists(&[
            queue_key(&lock),
            format!("distlock:{{{}}}:next", lock.as_str()),
        ])
        .await
        .unwrap();
    assert_eq!(leftovers, 0, "nothing left behind");
}

/// Puts `member` at the head of `lock`'s line, as a waiter that arrived first.
async fn fake_head(con: &redis::aio::MultiplexedConnection, lock: &LockName, member: &str) {
    let () = con.clone().zadd(queue_key(lock), member, -1).await.unwrap();
}

/// A waiter behind the head, woken only by the store (or `recheck`).
async fn second_in_line(
    url: &str,
    con: &redis::aio::MultiplexedConnection,
    lock: &LockName,
    recheck: Duration,
) -> tokio::task::JoinHandle<(lockcore::LockGuard, Instant)> {
    let locker = patient(RedisBackend::connect(url).await.unwrap()).recheck(recheck);
    let task = tokio::spawn({
        let lock = lock.clone();
        async move {
            let guard = locker.acquire(&lock).await.unwrap();
            (guard, Instant::now())
        }
    });
    in_line(con, lock, 2).await;
    task
}

/// A wake-up reaches a live instance for a wait it no longer has (the wait
/// ended between its entry being popped and the message arriving). The
/// instance passes the hand-off on at once: the next waiter gets the lock
/// in moments, not at its re-check a minute later (after the 1 s
/// reservation lapsed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_for_an_ended_wait_is_passed_on() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let con = raw(&url).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = name("pass-on");
    let lease = acquire(&holder, &lock, LONG).await;
    // An instance whose wait ended: subscribed, but no such wait.
    let ended = RedisBackend::connect(&url).await.unwrap();
    let gave_up = Locker::new(ended.clone())
        .ttl(LONG)
        .acquire_timeout(&lock, Duration::from_millis(100))
        .await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    until(
        Duration::from_secs(10),
        "the timed-out wait left",
        || async { queue_len(&con, &lock).await == 0 },
    )
    .await;
    let channels = wake_channels(&con).await;
    assert_eq!(channels.len(), 1, "{channels:?}");
    fake_head(&con, &lock, &format!("999999:1000:{}", channels[0])).await;
    let second = second_in_line(&url, &con, &lock, Duration::from_secs(60)).await;

    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (guard, granted) = second.await.unwrap();
    assert!(
        granted - released < Duration::from_secs(5),
        "passed on, not left to lapse: {:?}",
        granted - released
    );
    guard.release().await.unwrap();
    drop(ended);
}

/// A wait is cancelled while the free lock is reserved for it (its wake-up
/// was lost, so it never claimed). Leaving the line passes the reservation
/// on: the next waiter gets the lock at once, not after the reservation
/// (a minute here) or its own re-check (a minute too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_passes_its_reservation_on() {
    let url = launcher::shared().url();
    let mut con = raw(&url).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = name("cancel-reserved");
    let lease = acquire(&holder, &lock, LONG).await;
    let cancel = lockcore::backend::CancellationToken::new();
    let first = tokio::spawn({
        let (locker, lock, cancel) = (
            patient(RedisBackend::connect(&url).await.unwrap()),
            lock.clone(),
            cancel.clone(),
        );
        async move { locker.acquire_cancellable(&lock, &cancel).await }
    });
    in_line(&con, &lock, 1).await;
    let second = second_in_line(&url, &con, &lock, Duration::from_secs(60)).await;
    // A release whose wake-up to the first waiter was lost: the lock is
    // free and reserved for it.
    let head: Vec<String> = con.zrange(queue_key(&lock), 0, 0).await.unwrap();
    let lock_key = format!("distlock:{{{}}}", lock.as_str());
    let () = redis::pipe()
        .atomic()
        .zrem(queue_key(&lock), &head[0])
        .ignore()
        .cmd("SET")
        .arg(format!("{lock_key}:next"))
        .arg(&head[0])
        .arg("PX")
        .arg(60_000)
        .ignore()
        .del(&lock_key)
        .ignore()
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(matches!(
        holder.try_acquire_for(&lock, LONG).await.unwrap(),
        Attempt::Held { .. }
    ));

    let cancelled = Instant::now();
    cancel.cancel();
    assert!(matches!(
        first.await.unwrap(),
        Err(LockError::Cancelled { .. })
    ));
    let (guard, granted) = second.await.unwrap();
    assert!(
        granted - cancelled < Duration::from_secs(5),
        "took {:?}",
        granted - cancelled
    );
    assert!(guard.fencing_token() > lease.fence());
    guard.release().await.unwrap();
}

/// The head of the line belongs to an instance that is gone (no
/// subscriber): the release skips it and wakes the next waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_waiters_are_skipped() {
    let url = launcher::shared().url();
    let con = raw(&url).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = name("gone");
    let lease = acquire(&holder, &lock, LONG).await;
    fake_head(&con, &lock, "7:60000:distlock:wake:gone-instance").await;
    let second = second_in_line(&url, &con, &lock, Duration::from_secs(60)).await;
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (guard, granted) = second.await.unwrap();
    assert!(
        granted - released < Duration::from_secs(5),
        "took {:?}",
        granted - released
    );
    assert_eq!(queue_len(&con, &lock).await, 0);
    guard.release().await.unwrap();
}

/// The head of the line belongs to an instance that hears the wake-up but
/// never claims (hung). The free lock stays reserved for it for its claim
/// window and no longer: nobody gets it before, the next waiter gets it
/// right after (at its next re-check), and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_waiter_holds_a_hand_off_for_its_claim_window_only() {
    const WINDOW: Duration = Duration::from_millis(400);
    let url = launcher::shared().url();
    let con = raw(&url).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = name("hung");
    let lease = acquire(&holder, &lock, LONG).await;
    let channel = format!("distlock:wake:hung-{:x}", rand_u64());
    let mut hung = redis::Client::open(url.as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    hung.subscribe(&channel).await.unwrap();
    fake_head(&con, &lock, &format!("1:{}:{channel}", WINDOW.as_millis())).await;
    let recheck = Duration::from_millis(100);
    let second = second_in_line(&url, &con, &lock, recheck).await;

    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    // Reserved: free, yet nobody else may take it.
    assert_eq!(holder.inspect(&lock).await.unwrap(), None);
    match holder.try_acquire_for(&lock, LONG).await.unwrap() {
        Attempt::Held { expires_in } => assert!(
            expires_in.is_some_and(|d| d <= WINDOW),
            "a reservation reports when it lapses: {expires_in:?}"
        ),
        Attempt::Acquired(lease) => panic!("a reserved lock was granted to a newcomer: {lease:?}"),
    }
    let (guard, granted) = second.await.unwrap();
    let waited = granted - released;
    assert!(
        waited >= WINDOW,
        "granted {waited:?} after release, inside the window"
    );
    assert!(
        waited < WINDOW + recheck + Duration::from_secs(1),
        "granted {waited:?} after release"
    );
    assert_eq!(queue_len(&con, &lock).await, 0);
    guard.release().await.unwrap();
    drop(hung);
}

/// Waits that end without the lock (timed out, cancelled, dropped) leave
/// the line, and the lock goes straight to a newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_end_leave_the_line() {
    let url = launcher::shared().url();
    let con = raw(&url).await;
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = name("leave");
    let lease = acquire(&holder, &lock, LONG).await;
    let lockers: Vec<Locker> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(patient(RedisBackend::connect(&url).await.unwrap()));
        }
        v
    };
    let timed_out = tokio::spawn({
        let (locker, lock) = (lockers[0].clone(), lock.clone());
        async move {
            locker
                .acquire_timeout(&lock, Duration::from_millis(300))
                .await
        }
    });
    let cancel = lockcore::backend::CancellationToken::new();
    let cancelled = tokio::spawn({
        let (locker, lock, cancel) = (lockers[1].clone(), lock.clone(), cancel.clone());
        async move { locker.acquire_cancellable(&lock, &cancel).await }
    });
    let dropped = tokio::spawn({
        let (locker, lock) = (lockers[2].clone(), lock.clone());
        async move { locker.acquire(&lock).await }
    });
    in_line(&con, &lock, 3).await;
    cancel.cancel();
    dropped.abort();
    assert!(matches!(
        timed_out.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    assert!(matches!(
        cancelled.await.unwrap(),
        Err(LockError::Cancelled { .. })
    ));
    assert!(dropped.await.unwrap_err().is_cancelled());
    until(Duration::from_secs(10), "an empty line", || async {
        queue_len(&con, &lock).await == 0
    })
    .await;
    holder.release(&lease).await.unwrap();
    let next = acquire(&holder, &lock, LONG).await;
    holder.release(&next).await.unwrap();
}

async fn aof_size(con: &redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("aof_current_size:"))
        .map(|n| n.trim().parse().unwrap())
        .expect("AOF is on")
}

/// Joining the line writes nothing to the AOF (no fsync per waiter); the
/// lock itself stays durable. A crash forgets the line, not the lock: once
/// the waiters' subscriptions are back they rejoin, and the release after
/// the restart still wakes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_stays_out_of_the_aof_and_a_restart_costs_a_rejoin() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = name("aof-line");
    let lease = acquire(&holder, &lock, LONG).await;
    let con = raw(&url).await;
    let before = aof_size(&con).await;
    let mut tasks = Vec::new();
    for i in 0..2 {
        // Attempts that fail while the server restarts retry after a short
        // backoff; only re-checks are long.
        let locker = patient(RedisBackend::connect(&url).await.unwrap()).backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(500),
        ));
        let waited = lock.clone();
        tasks.push(tokio::spawn(async move {
            let guard = locker.acquire(&waited).await?;
            guard.release().await
        }));
        in_line(&con, &lock, i + 1).await;
    }
    assert_eq!(
        aof_size(&con).await,
        before,
        "joining the line wrote to the AOF"
    );

    store.kill().await.unwrap();
    store.restart().await.unwrap();
    let con = raw(&url).await;
    assert_eq!(queue_len(&con, &lock).await, 0, "the line is forgotten");
    let after = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(
        after.inspect(&lock).await.unwrap().map(|h| h.fence),
        Some(lease.fence()),
        "the lock is not"
    );
    in_line(&con, &lock, 2).await;
    let released = Instant::now();
    assert_eq!(
        after.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), ReleaseOutcome::Released);
    }
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken by the store, not the 60 s re-check"
    );
}

/// The subscription connection dies while a waiter waits: it is
/// re-established and the next release still wakes the waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_survives_a_dropped_subscription() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let waiter = RedisBackend::connect(&url).await.unwrap();
    let lock = name("resubscribe");
    let lease = acquire(&holder, &lock, LONG).await;
    let locker = Locker::new(waiter)
        .ttl(LONG)
        .recheck(Duration::from_secs(60))
        .backoff(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ));
    let task = tokio::spawn({
        let lock = lock.clone();
        async move { locker.acquire(&lock).await.map(|g| (g, Instant::now())) }
    });
    let mut con = raw(&url).await;
    in_line(&con, &lock, 1).await;
    assert_eq!(pubsub_clients(&con).await, 2); // the waiter's and the holder's
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(killed, 2);
    until(Duration::from_secs(10), "the re-subscriptions", || async {
        pubsub_clients(&con).await == 2
    })
    .await;
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (guard, woke) = task.await.unwrap().unwrap();
    assert!(
        woke - released < Duration::from_secs(5),
        "took {:?}",
        woke - released
    );
    guard.release().await.unwrap();
}

/// T3.2: the reply to an acquire is lost. The caller gets a retryable error;
/// the grant the store did make is cleaned up as soon as the network heals,
/// long before its TTL; the client then works again on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_leaves_no_phantom_holder() {
    let store = launcher::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    let cut = RedisBackend::connect_with(via).await.unwrap();
    let direct = RedisBackend::connect(&store.url()).await.unwrap();
    let lock = name("phantom");
    // Load the scripts first, so the lost request really runs on the server.
    let warm = acquire(&cut, &lock, LONG).await;
    cut.release(&warm).await.unwrap();

    proxy.set(Mode::DropDownstream);
    let outcome = cut.try_acquire_for(&lock, LONG).await;
    assert!(
        matches!(&outcome, Err(e) if e.is_retryable()),
        "a lost reply is a retryable error: {outcome:?}"
    );
    let fence_key = format!("distlock:{{{}}}:fence", lock.as_str());
    let counter: u64 = raw(&store.url()).await.get(&fence_key).await.unwrap();
    assert!(
        counter > warm.fence().get(),
        "the lost acquire ran on the server"
    );

    proxy.set(Mode::Pass);
    let healed = Instant::now();
    until(
        Duration::from_secs(10),
        "cleanup of the phantom grant",
        || async { direct.inspect(&lock).await.unwrap().is_none() },
    )
    .await;
    assert!(
        healed.elapsed() < LONG / 4,
        "cleaned up long before the TTL"
    );
    let lease = acquire(&cut, &lock, LONG).await;
    assert!(lease.fence().get() > counter);
    assert_eq!(cut.release(&lease).await.unwrap(), ReleaseOutcome::Released);
}

/// T4.11: passwords and ACL users. Wrong credentials are a permanent error,
/// never shown; a user limited to its prefix locks there and nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_acl_users() {
    let store = private(Options::durable()).await;
    let addr = store.addr();
    let mut con = raw(&store.url()).await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(">locker-pw-123")
        .arg("~app:*")
        .arg("&app:*")
        .arg("+@all")
        .arg("-@dangerous")
        .query_async(&mut con)
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("admin-pw-456")
        .query_async(&mut con)
        .await
        .unwrap();

    for (url, what) in [
        (format!("redis://{addr}"), "no password"),
        (format!("redis://:wrong-pw-789@{addr}"), "wrong password"),
        (
            format!("redis://locker:wrong-pw-789@{addr}"),
            "wrong user password",
        ),
    ] {
        let err = RedisBackend::connect(&url).await.unwrap_err();
        assert!(matches!(err, LockError::Store { .. }), "{what}: {err:?}");
        assert!(!err.is_retryable(), "{what}");
        assert!(
            !format!("{err} {err:?}").contains("wrong-pw-789"),
            "{what}: {err:?}"
        );
    }

    let admin = RedisBackend::connect(&format!("redis://:admin-pw-456@{addr}"))
        .await
        .unwrap();
    assert!(!format!("{admin:?}").contains("admin-pw-456"));
    assert_eq!(admin.persistence(), &Persistence::AofAlways);

    let user_url = format!("redis://locker:locker-pw-123@{addr}");
    let config = RedisConfig::from_url(&user_url).unwrap().key_prefix("app:");
    assert!(!format!("{config:?}").contains("locker-pw-123"));
    let user = RedisBackend::connect_with(config).await.unwrap();
    assert!(
        matches!(user.persistence(), Persistence::Unknown(_)),
        "CONFIG is denied to this user: {:?}",
        user.persistence()
    );
    let lock = name("acl");
    let lease = acquire(&user, &lock, LONG).await;
    // Waiting needs the user's own channel (`&app:*`) and line keys.
    let waiter = patient(
        RedisBackend::connect_with(RedisConfig::from_url(&user_url).unwrap().key_prefix("app:"))
            .await
            .unwrap(),
    );
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { waiter.acquire(&lock).await }
    });
    until(Duration::from_secs(10), "the user's waiter in line", || {
        let (mut con, key) = (con.clone(), format!("app:{{{}}}:queue", lock.as_str()));
        async move { con.zcard::<_, usize>(key).await.unwrap() == 1 }
    })
    .await;
    assert_eq!(
        user.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let woken = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the store, not the 60 s re-check")
        .unwrap()
        .unwrap();
    woken.release().await.unwrap();

    let outside = RedisBackend::connect_with(
        RedisConfig::from_url(&user_url)
            .unwrap()
            .key_prefix("other:"),
    )
    .await
    .unwrap();
    let denied = outside.try_acquire_for(&lock, LONG).await;
    assert!(matches!(denied, Err(LockError::Store { .. })), "{denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_prompt_retryable_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = RedisConfig::from_url(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = RedisBackend::connect_with(config).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_refuse_older_tokens() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = backend.connection();
    let tag = format!("{{order:{:x}}}", rand_u64());
    let (fence_key, data_key) = (format!("{tag}:fence"), format!("{tag}:data"));
    let token = |n: u64| FencingToken::new(n).unwrap();
    let set = |v: &str| redis::cmd("SET").arg(&data_key).arg(v).clone();

    let applied: Fenced<String> = fenced_apply(&mut con, &fence_key, token(5), &set("five"))
        .await
        .unwrap();
    assert_eq!(applied, Fenced::Applied("OK".into()));
    let again: Fenced<String> = backend
        .fenced_apply(&fence_key, token(5), &set("five again"))
        .await
        .unwrap();
    assert!(matches!(again, Fenced::Applied(_)), "equal tokens pass");
    let stale: Fenced<String> = fenced_apply(&mut con, &fence_key, token(4), &set("four"))
        .await
        .unwrap();
    assert_eq!(stale, Fenced::Stale { last: 5 });
    let data: String = con.get(&data_key).await.unwrap();
    assert_eq!(data, "five again");

    // Exact for every u64, beyond Lua's 2^53.
    let big = u64::MAX - 1;
    let applied: Fenced<String> = fenced_apply(&mut con, &fence_key, token(big), &set("big"))
        .await
        .unwrap();
    assert!(matches!(applied, Fenced::Applied(_)));
    let stale: Fenced<String> = fenced_apply(&mut con, &fence_key, token(big - 1), &set("no"))
        .await
        .unwrap();
    assert_eq!(stale, Fenced::Stale { last: big });

    // A failing command changes nothing, the fence included.
    let incr = redis::cmd("INCR").arg(&data_key).clone();
    let failed = fenced_apply::<i64, _>(&mut con, &fence_key, token(u64::MAX), &incr).await;
    assert!(matches!(failed, Err(LockError::Store { .. })), "{failed:?}");
    let last: String = con.get(&fence_key).await.unwrap();
    assert_eq!(last, big.to_string());

    let empty =
        fenced_apply::<(), _>(&mut con, &fence_key, token(u64::MAX), &redis::Cmd::new()).await;
    assert!(
        matches!(empty, Err(LockError::InvalidConfig { .. })),
        "{empty:?}"
    );
    let () = con.set(&fence_key, "garbage").await.unwrap();
    let garbage = fenced_apply::<String, _>(&mut con, &fence_key, token(9), &set("x")).await;
    assert!(
        matches!(garbage, Err(LockError::Store { .. })),
        "{garbage:?}"
    );
    let _: () = con.del(&[&fence_key, &data_key]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_under_the_prefix_is_an_error_not_a_panic() {
    let url = launcher::shared().url();
    let backend = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let lock = name("foreign");
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
    let lease = acquire(&backend, &lock, LONG).await;
    backend.release(&lease).await.unwrap();
}
