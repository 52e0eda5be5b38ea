//! The lock file's schema: a file of schema 1 (before reader-writer locks)
//! is upgraded in place by the first client that connects, its rows and
//! fence counter kept, by one client however many connect at once; a file
//! of a newer schema is refused untouched. The table's checks keep each
//! kind's access as it must be.

use std::path::Path;
use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::{Kind, LockBackendExt, LockRequest};
use lockcore::{Access, LockBackend, LockError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{ConnectOptions, Connection, SqliteConnection};

use crate::support::{self, name};

/// Schema 1 as distlock wrote it, frozen here.
const SCHEMA_1: &[&str] = &[
    "CREATE TABLE distlock_fence (
        id   INTEGER PRIMARY KEY CHECK (id = 1),
        last INTEGER NOT NULL CHECK (last >= 0)
    )",
    "INSERT INTO distlock_fence (id, last) VALUES (1, 7)",
    "CREATE TABLE distlock_leases (
        kind         TEXT    NOT NULL CHECK (kind IN ('lock', 'permit')),
        name         TEXT    NOT NULL,
        slot         INTEGER NOT NULL CHECK (slot >= 0),
        permits      INTEGER NOT NULL CHECK (permits >= 1),
        owner        TEXT    NOT NULL,
        fence        INTEGER NOT NULL UNIQUE CHECK (fence > 0),
        label        TEXT,
        boot_id      TEXT    NOT NULL,
        expires_at   INTEGER NOT NULL,
        presence_dev INTEGER,
        presence_ino INTEGER,
        PRIMARY KEY (kind, name, slot)
    ) WITHOUT ROWID",
    "PRAGMA application_id = 1145850673",
    "PRAGMA user_version = 1",
];

/// How a client of schema 1 granted a lock: the same columns, no access.
const GRANT_1: &str = "INSERT OR REPLACE INTO distlock_leases (kind, name, slot, permits, owner,
    fence, label, boot_id, expires_at, presence_dev, presence_ino)
    VALUES ('lock', ?1, 0, 1, 'an-owner', ?2, 'old-client', ?3, ?4, NULL, NULL)";

async fn open(path: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .connect()
        .await
        .unwrap()
}

async fn version(path: &Path) -> i64 {
    let mut conn = open(path).await;
    let version = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    version
}

/// Grants lock `n` under `fence` for an hour through `conn` as a client of
/// schema 1 does (its statement prepared once and kept).
async fn grant_1(conn: &mut SqliteConnection, n: &str, fence: i64) {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let hour_on = lockcore::backend::Moment::now().boot().unwrap() + Duration::from_secs(3600);
    sqlx::query(GRANT_1)
        .bind(n)
        .bind(fence)
        .bind(boot.trim())
        .bind(hour_on.as_nanos() as i64)
        .execute(conn)
        .await
        .unwrap();
}

/// A file of schema 1 with lock `kept` held (fence 7, label `old-client`)
/// for an hour by a holder without a presence file; the connection of a
/// client of schema 1 that made it, still open.
async fn schema_1(path: &Path) -> SqliteConnection {
    let mut conn = open(path).await;
    for statement in SCHEMA_1 {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    grant_1(&mut conn, "kept", 7).await;
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_schema_1_is_upgraded_in_place_once() {
    let file = support::SqliteFactory::fresh();
    let mut old = schema_1(file.path()).await;
    let url = support::url(file.path());
    let (a, b) = tokio::join!(SqliteBackend::connect(&url), SqliteBackend::connect(&url));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(version(file.path()).await, 2);
    let kept = a
        .inspect(&name("kept"))
        .await
        .unwrap()
        .expect("the row kept");
    assert_eq!(kept.fence.get(), 7);
    assert_eq!(kept.label.unwrap().to_string(), "old-client");
    let lock = b
        .try_acquire_for(&name("kept"), Duration::from_secs(60))
        .await;
    assert!(lock.unwrap().into_lease().is_none(), "still held");
    let ttl = b
        .capabilities()
        .effective_ttl(Duration::from_secs(60))
        .unwrap();
    let read = LockRequest::new(name("kept"), ttl).with_access(Access::Read);
    let read = b.try_acquire(&read).await.unwrap().into_lease().unwrap();
    assert_eq!(read.fence().get(), 8, "the counter goes on");
    let holders = a.holders(&name("kept"), Kind::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 1);
    b.release(&read).await.unwrap();
    // The client of schema 1, connected before, goes on granting.
    grant_1(&mut old, "old-again", 100).await;
    let again = a.inspect(&name("old-again")).await.unwrap();
    assert_eq!(again.expect("granted by the old client").fence.get(), 100);
    old.close().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The table refuses a reader-writer row without its access, and an access
/// on any other kind.
#[tokio::test]
async fn each_kind_keeps_its_access_as_it_must() {
    let file = support::SqliteFactory::fresh();
    let client = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    client.close().await.unwrap();
    let mut conn = open(file.path()).await;
    let insert = |n: i64, kind: &'static str, access: Option<&'static str>| {
        sqlx::query(
            "INSERT INTO distlock_leases (kind, name, slot, permits, owner, fence, boot_id,
                 expires_at, access) VALUES (?2, 'n', ?1, 1, 'o', ?1, 'b', 0, ?3)",
        )
        .bind(n)
        .bind(kind)
        .bind(access)
    };
    let cases = [
        ("rw", None, false),
        ("rw", Some("other"), false),
        ("lock", Some("read"), false),
        ("intent", Some("write"), false),
        ("rw", Some("read"), true),
        ("rw", Some("write"), true),
        ("intent", None, true),
        ("permit", None, true),
    ];
    for (n, (kind, access, ok)) in (1..).zip(cases) {
        let done = insert(n, kind, access).execute(&mut conn).await;
        assert_eq!(done.is_ok(), ok, "{kind} {access:?}: {done:?}");
    }
    conn.close().await.unwrap();
}

#[tokio::test]
async fn a_file_of_a_newer_schema_is_refused_untouched() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    SqliteBackend::connect(&url)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let mut conn = open(file.path()).await;
    sqlx::query("PRAGMA user_version = 3")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let refused = SqliteBackend::connect(&url).await;
    assert!(
        matches!(&refused, Err(LockError::InvalidConfig { .. }) if refused.as_ref().unwrap_err().to_string().contains("newer distlock")),
        "{refused:?}"
    );
    assert_eq!(version(file.path()).await, 3);
}
