//! The wait line: one subscription per backend, one waiter woken per
//! release in arrival order, wake-ups passed on, gone and hung waiters
//! skipped, cancelled waits leaving the line.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_conformance::kit::until;
use lock_redis::RedisBackend;
use lock_redis::redis::{self, AsyncCommands};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockError, LockName, Locker, ReleaseOutcome};
use tokio::time::Instant;

/// One backend, six waits on three names: one pub/sub connection and one
/// channel, whatever the number of waits and names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscription_per_backend_however_many_waits() {
    let store = private(Options::durable()).await;
    let url = store.url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let waiter = patient(RedisBackend::connect(&url).await.unwrap());
    let con = raw(&url).await;
    let locks: Vec<LockName> = (0..3).map(|i| unique(&format!("bounded-{i}"))).collect();
    let mut leases = Vec::new();
    for lock in &locks {
        leases.push(take(&holder, lock, LONG).await);
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
/// first, and grants it the lock in the same script: the lock changes
/// hands five times for one script per release, with no losing attempts
/// and no claims, in arrival order, with growing fences. The line expires
/// on its own if nobody refreshes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_exactly_one_instance_in_arrival_order() {
    const WAITERS: usize = 5;
    let store = private(Options::durable()).await;
    let url = store.url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let lock = unique("wake-one");
    let warm = take(&holder, &lock, LONG).await;
    holder.release(&warm).await.unwrap();
    let first = take(&holder, &lock, LONG).await;
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

    let stats = con.clone();
    let before = command_calls(&stats, "evalsha").await;
    let started = Instant::now();
    holder.release(&first).await.unwrap();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), ReleaseOutcome::Released);
    }
    assert!(
        started.elapsed() < scaled(Duration::from_secs(10)),
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
    let calls = command_calls(&stats, "evalsha").await - before;
    assert_eq!(
        calls,
        (1 + WAITERS) as u64,
        "one release + {WAITERS} releases, each handing over; more means a release woke more \
         than one waiter, or a waiter claimed"
    );
    let leftovers: i64 = con
        .clone()
        .exists(&[
            queue_key(&lock),
            format!("distlock:{{{}}}:next", lock.as_str()),
            format!("distlock:{{{}}}:offers", lock.as_str()),
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
    let lock = unique("pass-on");
    let lease = take(&holder, &lock, LONG).await;
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
    let lock = unique("cancel-reserved");
    let lease = take(&holder, &lock, LONG).await;
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
    let lock = unique("gone");
    let lease = take(&holder, &lock, LONG).await;
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
    let lock = unique("hung");
    let lease = take(&holder, &lock, LONG).await;
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
    let lock = unique("leave");
    let lease = take(&holder, &lock, LONG).await;
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
    let next = take(&holder, &lock, LONG).await;
    holder.release(&next).await.unwrap();
}
