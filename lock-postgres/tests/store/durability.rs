//! What waits for the WAL flush: every grant does, a release does not (it
//! draws no fence, and a release lost in a crash leaves the lease to
//! expire). WAL is flushed in order, so the grant after a release makes
//! both durable: an acquire + release cycle costs one flush, counted by the
//! server itself (`pg_stat_wal.wal_sync`) on a server of its own.

use std::time::Duration;

use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::sqlx::{self, PgPool};
use lockcore::{LockBackend, Locker};
use tokio::time::Instant;

use crate::support::{await_sessions, backend, lock_name, unique, with_app};

/// The WAL writer's sleep on the private server (its maximum): it flushes
/// what asynchronous commits left at most once per sleep, so the count
/// beyond the grants' own flushes is bounded by the run's length.
const WAL_WRITER_DELAY: Duration = Duration::from_secs(10);

/// The server's WAL flushes so far (every process's, once they report).
async fn wal_syncs(observer: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT wal_sync FROM pg_stat_wal")
        .fetch_one(observer)
        .await
        .unwrap()
}

/// Waits until no session of `app` is left (each reported its counts).
async fn gone(observer: &PgPool, app: &str) {
    await_sessions(observer, app, "the sessions gone", |s| s.total == 0).await;
}

#[tokio::test]
async fn a_cycle_waits_for_one_flush_the_grants() {
    const CYCLES: i64 = 200;
    let delay = format!("{}ms", WAL_WRITER_DELAY.as_millis());
    let store = postgres::start(Options::default().setting("wal_writer_delay", &delay))
        .expect("private postgres");
    let observer = PgPool::connect(&store.url()).await.unwrap();
    let app = unique("flushes");
    let client = backend(&with_app(&store.url(), &app)).await;
    let locker = Locker::new(client.clone()).ttl(Duration::from_secs(30));
    let name = lock_name("flushes");
    // The table and the pool's connection made, and their flushes counted.
    locker
        .acquire(&name)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    client.close().await.unwrap();
    gone(&observer, &app).await;
    let before = wal_syncs(&observer).await;

    let client = backend(&with_app(&store.url(), &app)).await;
    let locker = Locker::new(client.clone()).ttl(Duration::from_secs(30));
    let started = Instant::now();
    for _ in 0..CYCLES {
        let guard = locker.acquire(&name).await.unwrap();
        guard.release().await.unwrap();
    }
    // A backend reports its counts when it ends: end them all.
    client.close().await.unwrap();
    gone(&observer, &app).await;
    let flushes = wal_syncs(&observer).await - before;
    eprintln!("{flushes} WAL flushes for {CYCLES} acquire + release cycles");
    // One per grant (each waits for its own), give or take the WAL
    // writer's (at most one per sleep of the run, which may also flush a
    // grant's commit before the grant does) and a few of the connection's
    // set-up and teardown: far from one more per release.
    let background =
        i64::try_from(started.elapsed().as_secs() / WAL_WRITER_DELAY.as_secs()).unwrap() + 1 + 5;
    assert!(
        (CYCLES - background..=CYCLES + background).contains(&flushes),
        "{flushes} WAL flushes for {CYCLES} acquire + release cycles (allowed: {background} either way)"
    );
}
