//! 2,000 tasks of one process waiting on one name through one `Locker`:
//! every one is served (each takes the lock, holds it a moment, releases),
//! because only the first local waiter waits on the file at a time. Without
//! the local line every release woke all 2,000 and each ran a write
//! transaction: a few hundred were served in a minute. Each hand-off is a
//! wake-up (the release's), within the bound `wakeups.rs` asserts of one
//! waiter: a waiter left to its re-check instead fails the test at once.

use std::time::Duration;

use lock_conformance::kit::scaled;
use lock_sqlite::SqliteBackend;
use lockcore::Locker;
use tokio::time::Instant;

use crate::support;

const WAITERS: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_on_one_name_are_all_served() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    // A waiter woken by a release is served within this (`wakeups.rs`).
    let woken_within = scaled(Duration::from_secs(1));
    let locker = Locker::new(SqliteBackend::connect(&url).await.unwrap())
        .ttl(Duration::from_secs(30))
        // Each waits behind up to 1,999 others: two durable transactions
        // per hand-off, a few ms each on this disk.
        .max_wait(scaled(Duration::from_secs(300)))
        // Only a wake-up serves the next waiter within `woken_within`: a
        // re-check comes far later.
        .recheck(woken_within * 30);
    let (count, mut served) = tokio::sync::watch::channel(0_usize);
    let started = Instant::now();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, count) = (locker.clone(), count.clone());
            tokio::spawn(async move {
                let guard = locker.acquire("hot").await?;
                count.send_modify(|n| *n += 1);
                guard.release().await.map(drop)
            })
        })
        .collect();
    // The name is free: the first waiter is served at once (while the rest
    // are spawned); each next one within a wake-up of the last (none has to
    // wait its re-check, or its whole `max_wait`, to find out).
    let mut within = scaled(Duration::from_secs(10));
    while *served.borrow_and_update() < WAITERS {
        let n = *served.borrow();
        tokio::time::timeout(within, served.changed())
            .await
            .unwrap_or_else(|_| panic!("{n} of {WAITERS} waiters served, then none for {within:?}"))
            .unwrap();
        // 2,000 hand-offs meet the slowest fsyncs of a loaded disk: five
        // wake-up bounds each, still a sixth of the re-check.
        within = woken_within * 5;
    }
    for task in tasks {
        task.await
            .expect("the waiter task")
            .expect("every waiter is served");
    }
    let took = started.elapsed();
    eprintln!(
        "{WAITERS} waiters on one name served in {took:?} ({:?} per hand-off)",
        took / WAITERS as u32
    );
    assert_eq!(*served.borrow(), WAITERS);
}
