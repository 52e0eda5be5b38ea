//! Fencing. The counter: fences survive every process closing the file
//! and reopening it; at the end of the counter's range a floor the counter
//! (a SQLite integer, up to `i64::MAX`) could not count past is refused
//! before any I/O and changes nothing, the largest floor accepted still
//! leaves room to grant, and a counter at its very end refuses grants with
//! a clear error instead of turning into a float.
//!
//! The resource: `fenced_write` in the caller's transaction on the
//! database that holds the data (never the lock file): a stale holder's
//! write is refused and rolled back, the current holder may write
//! repeatedly, the check and the write are one transaction (a stale check
//! waits for a newer holder's transaction and then sees its token), and the
//! slots of a semaphore are fenced apart.

use std::path::Path;
use std::time::Duration;

use lock_sqlite::sqlx::{self, Connection, SqlitePool};
use lock_sqlite::{ResourceFence, SqliteBackend, fenced_write, fenced_write_slot};
use lockcore::backend::LockBackendExt;
use lockcore::{Fenced, FencingToken, Lease, LockBackend, LockError, LockName, StaleToken};

use crate::support::{self, name};

/// The application's own database (WAL, as SQLite is used beside other
/// writers), with a table `inventory(id, quantity)` holding 10 units of 42.
async fn inventory(dir: &Path) -> SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("app.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePool::connect_with(options).await.unwrap();
    sqlx::query("CREATE TABLE inventory (id INTEGER PRIMARY KEY, quantity INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO inventory VALUES (42, 10)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

async fn quantity(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT quantity FROM inventory WHERE id = 42")
        .fetch_one(pool)
        .await
        .unwrap()
}

const DECREMENT: &str =
    "UPDATE inventory SET quantity = quantity - 1 WHERE id = ?1 AND quantity > 0";

async fn acquired(backend: &SqliteBackend, lock: &LockName, ttl: Duration) -> Lease {
    backend
        .try_acquire_for(lock, ttl)
        .await
        .unwrap()
        .into_lease()
        .expect("a free lock")
}

/// The worked example of the README: an inventory decrement guarded by
/// `fenced_write` in the same transaction. A stale holder's decrement is
/// refused and rolled back; the current holder may write repeatedly.
#[tokio::test]
async fn fenced_write_guards_the_inventory_decrement() {
    let dir = tempfile::tempdir().unwrap();
    let backend = SqliteBackend::connect(&support::url(&dir.path().join("locks.db")))
        .await
        .unwrap();
    let pool = inventory(dir.path()).await;
    let lock = LockName::new("sku-42").unwrap();

    // A holds the lock, is paused past its TTL, B takes over and writes.
    let old = acquired(&backend, &lock, Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    let new = acquired(&backend, &lock, Duration::from_secs(30)).await;
    assert!(new.fence() > old.fence());
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        fenced_write(&mut tx, "inventory:42", new.fence())
            .await
            .unwrap()
            .expect("the current holder writes");
        sqlx::query(DECREMENT)
            .bind(42_i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    // A wakes up and tries its write with the old token: refused.
    let mut tx = pool.begin().await.unwrap();
    let refused = fenced_write(&mut tx, "inventory:42", old.fence())
        .await
        .unwrap();
    assert_eq!(
        refused,
        Err(StaleToken {
            token: old.fence(),
            highest: new.fence()
        })
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        quantity(&pool).await,
        8,
        "only the current holder's two decrements applied"
    );

    // Bad input: a token no lock hands out, a name with the slot separator.
    let mut tx = pool.begin().await.unwrap();
    let huge = FencingToken::new(u64::MAX).unwrap();
    assert!(matches!(
        fenced_write(&mut tx, "inventory:42", huge).await,
        Err(LockError::InvalidConfig { .. })
    ));
    assert!(matches!(
        fenced_write(&mut tx, "a\u{1f}1", new.fence()).await,
        Err(LockError::InvalidConfig { .. })
    ));
    tx.rollback().await.unwrap();
    backend.release(&new).await.unwrap();
    backend.close().await.unwrap();
}

/// The check and the write are one transaction: a stale holder checking
/// while a newer holder's transaction (checked, not yet committed) is open
/// waits for it, then sees its token and is refused; its write never lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_check_waits_for_the_newer_transaction_and_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = inventory(dir.path()).await;
    let (old, new) = (FencingToken::new(7).unwrap(), FencingToken::new(8).unwrap());
    let mut newer = pool.begin().await.unwrap();
    fenced_write(&mut newer, "inventory:42", new)
        .await
        .unwrap()
        .unwrap();
    let stale = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let outcome: Fenced<()> = fenced_write(&mut tx, "inventory:42", old).await.unwrap();
            if outcome.is_ok() {
                sqlx::query(DECREMENT)
                    .bind(42_i64)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            outcome
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !stale.is_finished(),
        "the stale check did not wait for the open transaction"
    );
    sqlx::query(DECREMENT)
        .bind(42_i64)
        .execute(&mut *newer)
        .await
        .unwrap();
    newer.commit().await.unwrap();
    assert_eq!(
        stale.await.unwrap(),
        Err(StaleToken {
            token: old,
            highest: new
        })
    );
    assert_eq!(quantity(&pool).await, 9, "only the newer holder wrote");
}

/// A fence table of another name, created on first use; bad names refused.
#[tokio::test]
async fn resource_fence_tables_can_have_another_name() {
    let dir = tempfile::tempdir().unwrap();
    let pool = inventory(dir.path()).await;
    let (old, new) = (FencingToken::new(7).unwrap(), FencingToken::new(8).unwrap());
    let custom = ResourceFence::new("fence_marks").unwrap();
    for fence in [custom, ResourceFence::default()] {
        let mut tx = pool.begin().await.unwrap();
        fence
            .write(&mut tx, "elsewhere", new)
            .await
            .unwrap()
            .unwrap();
        tx.commit().await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        assert!(
            fence
                .write(&mut tx, "elsewhere", old)
                .await
                .unwrap()
                .is_err()
        );
        tx.rollback().await.unwrap();
    }
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        tables,
        ["distlock_resource_fence", "fence_marks", "inventory"]
    );
    for bad in ["x\"; --", "", "1abc", "a b", &"t".repeat(65)] {
        assert!(
            matches!(
                ResourceFence::new(bad),
                Err(LockError::InvalidConfig { .. })
            ),
            "{bad:?}"
        );
    }
}

/// Per-slot fencing: a stale holder of slot 1 is refused once slot 1's new
/// holder wrote, while slot 0's (older) holder still writes, and the plain
/// resource of the same name is another mark altogether.
#[tokio::test]
async fn slots_are_fenced_apart() {
    let dir = tempfile::tempdir().unwrap();
    let pool = inventory(dir.path()).await;
    let token = |n| FencingToken::new(n).unwrap();
    let write = |slot: Option<u32>, fence: FencingToken| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let outcome = match slot {
                Some(slot) => fenced_write_slot(&mut tx, "uploads", slot, fence).await,
                None => fenced_write(&mut tx, "uploads", fence).await,
            }
            .unwrap();
            tx.commit().await.unwrap();
            outcome
        }
    };
    assert_eq!(write(Some(0), token(3)).await, Ok(()));
    assert_eq!(write(Some(1), token(9)).await, Ok(()));
    assert_eq!(
        write(Some(1), token(4)).await,
        Err(StaleToken {
            token: token(4),
            highest: token(9)
        }),
        "slot 1 was granted again: its stale holder is refused"
    );
    assert_eq!(
        write(Some(0), token(3)).await,
        Ok(()),
        "slot 0 is another story"
    );
    assert_eq!(
        write(None, token(1)).await,
        Ok(()),
        "the plain resource is a mark of its own"
    );
}

#[tokio::test]
async fn fences_survive_every_client_closing_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let n = name("reopen");
    let mut last = 0;
    for round in 0..3 {
        let backend = SqliteBackend::connect(&support::url(&path)).await.unwrap();
        for _ in 0..10 {
            let lease = backend
                .try_acquire_for(&n, Duration::from_secs(60))
                .await
                .unwrap()
                .into_lease()
                .unwrap();
            assert!(
                lease.fence().get() > last,
                "round {round}: {} <= {last}",
                lease.fence()
            );
            last = lease.fence().get();
            backend.release(&lease).await.unwrap();
        }
        // A floor far ahead, as after restoring a backup.
        if round == 1 {
            backend
                .raise_fence_floor(FencingToken::new(last + 1000).unwrap())
                .await
                .unwrap();
            last += 1000;
        }
        backend.close().await.unwrap();
    }
}

/// The counter as the file has it, and its SQLite type.
async fn counter(path: &Path) -> (String, String) {
    let mut conn = sqlx::SqliteConnection::connect(&support::url(path))
        .await
        .unwrap();
    let row = sqlx::query_as("SELECT CAST(last AS TEXT), typeof(last) FROM distlock_fence")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    row
}

#[tokio::test]
async fn a_floor_the_counter_cannot_count_past_is_refused_before_any_io() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let caps = backend.capabilities();
    assert_eq!(caps.max_fence, i64::MAX as u64);
    let before = counter(file.path()).await;
    for too_high in [
        caps.max_fence_floor() + 1,
        i64::MAX as u64 - 10,
        i64::MAX as u64,
        u64::MAX,
    ] {
        let too_high = FencingToken::new(too_high).unwrap();
        for refused in [
            backend.raise_fence_floor(too_high).await,
            lockcore::admin::raise_fence_floor(&backend, too_high).await,
        ] {
            assert!(
                matches!(&refused, Err(e @ LockError::InvalidConfig { .. }) if e.to_string().contains("at most")),
                "{too_high}: {refused:?}"
            );
        }
    }
    assert_eq!(
        counter(file.path()).await,
        before,
        "a refused floor moved the counter"
    );
    // Before any I/O: a closed client says the same, not Unavailable.
    backend.close().await.unwrap();
    let refused = backend
        .raise_fence_floor(FencingToken::new(u64::MAX).unwrap())
        .await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig { .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn the_largest_floor_accepted_still_grants() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let highest = backend.capabilities().max_fence_floor();
    backend
        .raise_fence_floor(FencingToken::new(highest).unwrap())
        .await
        .unwrap();
    let mut last = highest;
    for round in 0..3 {
        let lease = backend
            .try_acquire_for(&name(&format!("after-{round}")), Duration::from_secs(60))
            .await
            .unwrap()
            .into_lease()
            .expect("a free lock");
        assert!(lease.fence().get() > last);
        last = lease.fence().get();
        backend.release(&lease).await.unwrap();
    }
    assert_eq!(counter(file.path()).await.1, "integer");
    backend.close().await.unwrap();
}

/// Only a counter set by hand gets there (the floor leaves 2^32 grants of
/// room): every grant is refused, saying why, and the counter stays an
/// integer.
#[tokio::test]
async fn a_counter_at_its_end_refuses_grants_clearly() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&support::url(file.path()))
        .await
        .unwrap();
    sqlx::query("UPDATE distlock_fence SET last = ?1")
        .bind(i64::MAX)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    for _ in 0..2 {
        let refused = backend
            .try_acquire_for(&name("at-the-end"), Duration::from_secs(60))
            .await;
        assert!(
            matches!(&refused, Err(e @ LockError::Store { .. }) if e.to_string().contains("at its end")),
            "{refused:?}"
        );
    }
    assert_eq!(
        counter(file.path()).await,
        (i64::MAX.to_string(), "integer".to_owned())
    );
    backend.close().await.unwrap();
}
