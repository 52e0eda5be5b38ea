//! `fenced_write` in the caller's transaction: a stale holder's write is
//! refused and rolled back, the current holder may write repeatedly, and
//! the slots of a semaphore are fenced apart.

mod support;

use std::time::Duration;

use lock_postgres::sqlx::{self, PgPool};
use lock_postgres::{ResourceFence, fenced_write, fenced_write_slot};
use lockcore::{FencingToken, LockBackend, LockError, StaleToken};
use support::{acquired, backend, lock_name, shared_url, unique};

/// A table `inventory(id, quantity)` with one row of 10 units.
async fn inventory(pool: &PgPool) -> String {
    let table = unique("inventory");
    sqlx::query(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, quantity int NOT NULL)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!("INSERT INTO {table} VALUES (42, 10)"))
        .execute(pool)
        .await
        .unwrap();
    table
}

async fn quantity(pool: &PgPool, table: &str) -> i32 {
    sqlx::query_scalar(&format!("SELECT quantity FROM {table} WHERE id = 42"))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The worked example of the README: an inventory decrement guarded by
/// `fenced_write` in the same transaction. A stale holder's decrement is
/// refused and rolled back; the current holder may write repeatedly.
#[tokio::test]
async fn fenced_write_guards_the_inventory_decrement() {
    let backend = backend(&shared_url()).await;
    let pool = PgPool::connect(&shared_url()).await.unwrap();
    let table = inventory(&pool).await;
    let decrement =
        format!("UPDATE {table} SET quantity = quantity - 1 WHERE id = $1 AND quantity > 0");
    let resource = unique("inventory:42");
    let lock = lock_name("sku-42");

    // A holds the lock, is paused past its TTL, B takes over and writes.
    let old = acquired(&backend, &lock, Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    let new = acquired(&backend, &lock, Duration::from_secs(30)).await;
    assert!(new.fence() > old.fence());
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        fenced_write(&mut tx, &resource, new.fence())
            .await
            .unwrap()
            .expect("the current holder writes");
        sqlx::query(&decrement)
            .bind(42_i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    // A wakes up and tries its write with the old token: refused.
    let mut tx = pool.begin().await.unwrap();
    let refused = fenced_write(&mut tx, &resource, old.fence()).await.unwrap();
    assert_eq!(
        refused,
        Err(StaleToken {
            token: old.fence(),
            highest: new.fence()
        })
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        quantity(&pool, &table).await,
        8,
        "only the current holder's two decrements applied"
    );

    // Bad input: a token no lock hands out, a name with the slot separator.
    let mut tx = pool.begin().await.unwrap();
    let huge = FencingToken::new(u64::MAX).unwrap();
    assert!(matches!(
        fenced_write(&mut tx, &resource, huge).await,
        Err(LockError::InvalidConfig { .. })
    ));
    assert!(matches!(
        fenced_write(&mut tx, "a\u{1f}1", new.fence()).await,
        Err(LockError::InvalidConfig { .. })
    ));
    tx.rollback().await.unwrap();
    backend.release(&new).await.unwrap();
}

/// A fence table elsewhere, created on demand, and the backend's own table
/// (next to its lock table) work the same way.
#[tokio::test]
async fn resource_fence_tables_can_live_elsewhere() {
    let backend = backend(&shared_url()).await;
    let pool = PgPool::connect(&shared_url()).await.unwrap();
    let resource = unique("elsewhere");
    let (old, new) = (FencingToken::new(7).unwrap(), FencingToken::new(8).unwrap());
    let schema = unique("fences");
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let custom = ResourceFence::new(&schema, "fence_marks").unwrap();
    custom.ensure_table(&mut conn).await.unwrap();
    drop(conn);
    for fence in [custom, backend.resource_fence()] {
        let mut tx = pool.begin().await.unwrap();
        fence.write(&mut tx, &resource, new).await.unwrap().unwrap();
        tx.commit().await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        assert!(fence.write(&mut tx, &resource, old).await.unwrap().is_err());
        tx.rollback().await.unwrap();
    }
    assert!(ResourceFence::new("public", "x\"; --").is_err());
}

/// Per-slot fencing: a stale holder of slot 1 is refused once slot 1's new
/// holder wrote, while slot 0's (older) holder still writes, and the plain
/// resource of the same name is another mark altogether.
#[tokio::test]
async fn slots_are_fenced_apart() {
    // Connecting creates the default fence table, public.resource_fence.
    backend(&shared_url()).await;
    let pool = PgPool::connect(&shared_url()).await.unwrap();
    let resource = unique("uploads");
    let token = |n| FencingToken::new(n).unwrap();
    let write = |slot: Option<u32>, fence: FencingToken| {
        let (pool, resource) = (pool.clone(), resource.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            let outcome = match slot {
                Some(slot) => fenced_write_slot(&mut tx, &resource, slot, fence).await,
                None => fenced_write(&mut tx, &resource, fence).await,
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
