//! SQLite lock file: lock cycles next to the file's own floor, one durable
//! write transaction (`BEGIN IMMEDIATE` + one `UPDATE` + `COMMIT`, WAL,
//! `synchronous=FULL`) per acquire and one per release.

use std::sync::Arc;

use lock_sqlite::SqliteBackend;
use lockcore::{LockBackend, LockName};
use sqlx::Connection;

use crate::Settings;
use crate::harness::{self, Row};

pub async fn run(settings: &Settings) -> Vec<Row> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    let name = LockName::new("bench/sqlite").unwrap();
    let backend: Arc<dyn LockBackend> = Arc::new(SqliteBackend::connect(&url).await.unwrap());
    let cycles =
        harness::uncontended(backend, &name, settings.ttl, settings.warmup, settings.run).await;

    // The floor: the same file settings, two durable write transactions per cycle.
    let floor_url = format!("sqlite://{}/floor.db?mode=rwc", dir.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&floor_url).await.unwrap();
    for statement in [
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = FULL",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
        "INSERT INTO t VALUES (1, 0)",
    ] {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    let conn = tokio::sync::Mutex::new(conn);
    let floor = harness::timed(settings.warmup, settings.run, || async {
        let mut conn = conn.lock().await;
        for _ in 0..2 {
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
            sqlx::query("UPDATE t SET v = v + 1 WHERE id = 1")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    })
    .await;

    let clients: Vec<Arc<dyn LockBackend>> = futures_join(settings.contenders, &url).await;
    let contended = harness::contended(clients, &name, settings.ttl, settings.run).await;
    let ratio = cycles.per_sec() / floor.per_sec().max(1e-9);
    vec![
        Row::new("sqlite", "uncontended acquire+release", &cycles)
            .note(format!("{ratio:.2}x the floor")),
        Row::new(
            "sqlite",
            "floor: 2 x (BEGIN IMMEDIATE + UPDATE + COMMIT)",
            &floor,
        ),
        Row::new(
            "sqlite",
            format!("{}-way contended (hand-off)", settings.contenders),
            &contended.handoffs,
        )
        .note(format!("FIFO share {:.0}%", contended.fifo_share * 100.0)),
    ]
}

async fn futures_join(n: usize, url: &str) -> Vec<Arc<dyn LockBackend>> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(Arc::new(SqliteBackend::connect(url).await.unwrap()) as Arc<dyn LockBackend>);
    }
    clients
}
