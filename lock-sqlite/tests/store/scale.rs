//! 2,000 tasks of one process waiting on one name through one `Locker`:
//! every one is served (each takes the lock, holds it a moment, releases),
//! because only the first local waiter waits on the file at a time. Without
//! the local line every release woke all 2,000 and each ran a write
//! transaction: a few hundred were served in a minute.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_conformance::kit::{poll, scaled};
use lock_sqlite::SqliteBackend;
use lockcore::Locker;
use tokio::time::Instant;

use crate::support;

const WAITERS: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_on_one_name_are_all_served() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    let locker = Locker::new(SqliteBackend::connect(&url).await.unwrap())
        .ttl(Duration::from_secs(30))
        // Each waits behind up to 1,999 others: two durable transactions
        // per hand-off, a few ms each on this disk.
        .max_wait(scaled(Duration::from_secs(300)));
    let served = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, served) = (locker.clone(), served.clone());
            tokio::spawn(async move {
                let guard = locker.acquire("hot").await?;
                served.fetch_add(1, Ordering::Relaxed);
                guard.release().await.map(drop)
            })
        })
        .collect();
    // The name is free: the first waiter is served at once (the rest wait
    // their turn; none has to wait its whole `max_wait` to find out).
    poll::until(
        scaled(Duration::from_secs(10)),
        "a first waiter is served",
        || async { served.load(Ordering::Relaxed) > 0 },
    )
    .await;
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
    assert_eq!(served.load(Ordering::Relaxed), WAITERS);
}
