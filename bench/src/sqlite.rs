//! SQLite lock file: lock cycles next to the file's own floor, one durable
//! write transaction (`BEGIN IMMEDIATE` + one `UPDATE` + `COMMIT`, WAL,
//! `synchronous=FULL`, the adapter's settings) per acquire and one per
//! release. No server: the "round trip" is one such transaction, and the
//! store's CPU is this process's.

use std::path::PathBuf;
use std::sync::Arc;

use futures::FutureExt;
use lock_sqlite::SqliteBackend;
use lockcore::LockBackend;
use lockcore::backend::async_trait;
use sqlx::Connection;

use crate::Settings;
use crate::harness::{self, op};
use crate::lineup::{self, Lineup};
use crate::report::Report;
use crate::scale::{self, Pool, Probe};

const BACKEND: &str = "sqlite";

pub(crate) async fn run(settings: Settings) -> Report {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("locks.db");
    let url = format!("sqlite://{}", db.display());
    let connect = |url: String| async move {
        Arc::new(SqliteBackend::connect(&url).await.expect("connect")) as Arc<dyn LockBackend>
    };
    let backend = connect(url.clone()).await;

    // The floor's file: the same settings, one row to update.
    let floor_url = format!("sqlite://{}/floor.db?mode=rwc", dir.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&floor_url)
        .await
        .expect("floor db");
    for statement in [
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = FULL",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
        "INSERT INTO t VALUES (1, 0)",
    ] {
        sqlx::query(statement)
            .execute(&mut conn)
            .await
            .expect("floor setup");
    }
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&mut conn)
        .await
        .expect("version");
    let conn = Arc::new(tokio::sync::Mutex::new(conn));
    let transactions = |n: usize| {
        let conn = conn.clone();
        op(move || {
            let conn = conn.clone();
            async move {
                let mut conn = conn.lock().await;
                for _ in 0..n {
                    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
                    sqlx::query("UPDATE t SET v = v + 1 WHERE id = 1")
                        .execute(&mut *tx)
                        .await
                        .expect("update");
                    tx.commit().await.expect("commit");
                }
            }
        })
    };
    let round_trip = harness::timed(&transactions(1), settings.warmup, settings.run / 2).await;

    let mut contenders = Vec::new();
    for _ in 0..settings.contenders {
        contenders.push(connect(url.clone()).await);
    }
    let lineup = Lineup {
        backend: BACKEND.into(),
        round_trip: Some((
            "one durable write transaction (BEGIN IMMEDIATE + UPDATE + COMMIT)".into(),
            round_trip,
        )),
        floor: Some((
            "2 x (BEGIN IMMEDIATE + UPDATE + COMMIT), WAL, synchronous=FULL".into(),
            transactions(2),
        )),
        other_floors: Vec::new(),
        peers: Vec::new(),
        contended_peers: Vec::new(),
        backend_instance: backend,
        contenders,
        floor_target: None,
    };
    let mut report = lineup::measure(lineup, &settings).await;
    report.store(
        BACKEND,
        format!("SQLite {version} (bundled with sqlx)"),
        "WAL, synchronous=FULL; temp dir on the local disk",
    );
    // A file of its own, so the count of its descriptors is the scenario's.
    let scale_db = dir.path().join("scale.db");
    let scale_url = format!("sqlite://{}", scale_db.display());
    report.extend(
        scale::run(
            BACKEND,
            || connect(scale_url.clone()).boxed(),
            &Files {
                db: scale_db.clone(),
            },
            Pool {
                size: 3,
                what: "1 writer + 2 reader connections".into(),
            },
            &settings,
        )
        .await,
    );
    drop(dir);
    report
}

/// The lock file's connections are this process's descriptors on it.
struct Files {
    db: PathBuf,
}

#[async_trait]
impl Probe for Files {
    async fn connections(&self) -> Option<u64> {
        crate::sys::open_fds_to(&self.db)
    }
}
