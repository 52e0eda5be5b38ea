//! The wait line across trouble: it stays out of the AOF (a restart costs a
//! rejoin, never the lock), and waiting survives a dropped subscription.

use std::time::Duration;

use crate::support::*;
use lock_conformance::StoreControl;
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::redis::Options;
use lock_conformance::kit::until;
use lock_redis::RedisBackend;
use lock_redis::redis;
use lockcore::backend::LockBackendExt;
use lockcore::{Backoff, LockBackend, Locker, ReleaseOutcome};
use tokio::time::Instant;

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

/// Whether a file of `store`'s AOF (stopped) holds `key`.
fn in_aof(store: &Store, key: &str) -> bool {
    let dir = store
        .data_dir()
        .expect("a launched server has a data dir")
        .join("appendonlydir");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|file| std::fs::read(file.unwrap().path()).unwrap())
        .any(|bytes| bytes.windows(key.len()).any(|w| w == key.as_bytes()))
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
    let lock = unique("aof-line");
    let lease = take(&holder, &lock, LONG).await;
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
    // What the restart loads (the waiters may rejoin as soon as it is up).
    assert!(
        in_aof(&store, &format!("distlock:{{{lock}}}")),
        "the lock is not in the AOF"
    );
    assert!(!in_aof(&store, &queue_key(&lock)), "the line is in the AOF");
    store.restart().await.unwrap();
    let con = raw(&url).await;
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
        released.elapsed() < scaled(Duration::from_secs(10)),
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
    let lock = unique("resubscribe");
    let lease = take(&holder, &lock, LONG).await;
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
