//! Uncontended acquire+release cycles next to the file's floor (two durable
//! `BEGIN IMMEDIATE` + `UPDATE` + `COMMIT` transactions per cycle), until the
//! workspace benchmark (bench/, module `sqlite`) runs on this branch:
//! `cargo test --release -p lock-sqlite --test throughput -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockName};
use sqlx::Connection;

const RUN: Duration = Duration::from_secs(3);

#[tokio::test]
#[ignore = "a measurement, not a check: run it with --ignored --nocapture"]
async fn cycles_next_to_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let backend = SqliteBackend::connect(&format!("sqlite://{}/locks.db", dir.path().display()))
        .await
        .unwrap();
    let name = LockName::new("bench").unwrap();
    let started = Instant::now();
    let mut cycles = 0_u32;
    while started.elapsed() < RUN {
        let lease = backend
            .try_acquire_for(&name, Duration::from_secs(10))
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        backend.release(&lease).await.unwrap();
        cycles += 1;
    }
    let locked = f64::from(cycles) / started.elapsed().as_secs_f64();

    let url = format!("sqlite://{}/floor.db?mode=rwc", dir.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    for statement in [
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = FULL",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
        "INSERT INTO t VALUES (1, 0)",
    ] {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    let started = Instant::now();
    let mut floor_cycles = 0_u32;
    while started.elapsed() < RUN {
        for _ in 0..2 {
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
            sqlx::query("UPDATE t SET v = v + 1 WHERE id = 1")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        floor_cycles += 1;
    }
    let floor = f64::from(floor_cycles) / started.elapsed().as_secs_f64();
    eprintln!(
        "sqlite: {locked:.0} acquire+release/s, floor {floor:.0}/s (2 durable write transactions), {:.2}x",
        locked / floor
    );
}
