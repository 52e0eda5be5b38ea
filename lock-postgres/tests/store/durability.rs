//! What waits for the WAL flush: every grant does, a release does not (it
//! draws no fence, and a release lost in a crash leaves the lease to
//! expire). WAL is flushed in order, so the grant after a release makes
//! both durable: an acquire + release cycle costs one flush, counted by the
//! server itself (`pg_stat_wal.wal_sync`) on a server of its own.

use lock_conformance::kit::poll::until;
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::sqlx::{self, PgPool};
use lockcore::{LockBackend, Locker};
use std::time::Duration;

use crate::support::{backend, lock_name, unique, with_app};

/// The server's WAL flushes so far (every process's, once they report).
async fn wal_syncs(observer: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT wal_sync FROM pg_stat_wal")
        .fetch_one(observer)
        .await
        .unwrap()
}

/// Waits until no session of `app` is left (each reported its counts).
async fn gone(observer: &PgPool, app: &str) {
    until(
        scaled(Duration::from_secs(10)),
        "the sessions gone",
        || async {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(app)
            .fetch_one(observer)
            .await
            .unwrap();
            left == 0
        },
    )
    .await;
}

#[tokio::test]
async fn a_cycle_waits_for_one_flush_the_grants() {
    const CYCLES: i64 = 200;
    let store = postgres::start(Options::default()).expect("private postgres");
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
    for _ in 0..CYCLES {
        let guard = locker.acquire(&name).await.unwrap();
        guard.release().await.unwrap();
    }
    // A backend reports its counts when it ends: end them all.
    client.close().await.unwrap();
    gone(&observer, &app).await;
    let flushes = wal_syncs(&observer).await - before;
    eprintln!("{flushes} WAL flushes for {CYCLES} acquire + release cycles");
    // At least one per grant (each waited for its own); beyond those only
    // the server's background flushes (the WAL writer's, every 200 ms) and
    // the connection's set-up: far below one more per release.
    assert!(
        (CYCLES..CYCLES + CYCLES / 4).contains(&flushes),
        "{flushes} WAL flushes for {CYCLES} acquire + release cycles"
    );
}
