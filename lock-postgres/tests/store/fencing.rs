//! Fences: they only grow (across a re-created sequence, a server crash,
//! and server clock steps, judged on the server's clock); the fence floor's
//! bounds (the sequence is a bigint, so a floor that leaves it no room to
//! count, within `Capabilities::FENCE_FLOOR_HEADROOM` of `i64::MAX`, is
//! refused with `InvalidConfig` before any I/O and changes nothing; the
//! largest floor accepted still lets every kind of grant happen); and
//! `fenced_write` in the caller's transaction (a stale holder's write is
//! refused and rolled back, the current holder may write repeatedly, and
//! the slots of a semaphore are fenced apart).

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::sqlx::{self, PgPool};
use lock_postgres::{PostgresBackend, ResourceFence, fenced_write, fenced_write_slot};
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{
    Attempt, Capabilities, FencedResource, FencingToken, LockBackend, LockError, ReleaseOutcome,
    StaleToken,
};
use tokio::time::Instant;

use crate::support::{
    acquired, backend, connect, lock_name, lock_name as name, scaled, shared_url, sql_conn, unique,
    with_params,
};

/// An operator who drops the fence sequence cannot make fences go back: the
/// re-created sequence starts above every fence left in the table.
#[tokio::test]
async fn recreated_sequence_starts_above_existing_fences() {
    let table = unique("resync");
    let url = with_params(&shared_url(), &format!("table={table}"));
    let client = connect(&url).await;
    let lock = name("resync");
    let mut last = None;
    for _ in 0..5 {
        let lease = acquired(&client, &lock, Duration::from_secs(5)).await;
        last = Some(lease.fence());
        client.release(&lease).await.unwrap();
    }
    let mut conn = sql_conn(&url).await;
    sqlx::query(&format!("DROP SEQUENCE public.{table}_fence_seq"))
        .execute(&mut conn)
        .await
        .unwrap();
    let again = connect(&url).await;
    let lease = acquired(&again, &lock, Duration::from_secs(5)).await;
    assert!(
        Some(lease.fence()) > last,
        "fence {} after re-creating the sequence, {last:?} before",
        lease.fence()
    );
}

/// A connected backend whose server dies answers `Unavailable` (retryable)
/// within its operation timeout, and works again once the server is back.
#[tokio::test]
async fn server_crash_is_unavailable_then_recovers() {
    let store = postgres::start(Options::default()).expect("private postgres");
    let url = with_params(&store.url(), "timeout=1s");
    let client = connect(&url).await;
    let lock = name("crash");
    let held = acquired(&client, &lock, Duration::from_secs(60)).await;
    store.kill_now().unwrap();
    let started = Instant::now();
    let err = client
        .try_acquire_for(&name("during"), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(started.elapsed() < scaled(Duration::from_secs(3)));
    store.restart_now().expect("restart on the same data");
    let holder = eventually(
        Duration::from_secs(10),
        "service after the restart",
        || async { client.inspect(&lock).await.ok() },
    )
    .await;
    assert_eq!(
        holder.map(|h| h.fence),
        Some(held.fence()),
        "a held lock survives the crash with its fence"
    );
    let next = acquired(&client, &name("after"), Duration::from_secs(5)).await;
    assert!(
        next.fence() > held.fence(),
        "fences continue upward after kill -9"
    );
}

/// T3.9b: the server's clock jumps an hour forward (libfaketime): the
/// holder's lease is expired on the store's clock, its renew is refused, a
/// new holder gets a larger fence and the old holder's fenced write is
/// refused. A backward jump only lengthens leases (liveness, not safety).
#[tokio::test]
async fn server_clock_steps_are_judged_on_the_server() {
    let store =
        postgres::start(Options::default().faketime(true)).expect("postgres under faketime");
    let (a, b) = (connect(&store.url()).await, connect(&store.url()).await);
    let lock = name("clock");
    let resource = FencedResource::new(0_u32);
    let old = acquired(&a, &lock, Duration::from_secs(30)).await;
    resource.write(old.fence(), |v| *v += 1).unwrap();

    store.set_clock_offset(3600).unwrap();
    let new = acquired(&b, &lock, Duration::from_secs(30)).await;
    assert!(new.fence() > old.fence());
    assert!(
        matches!(a.renew(&old).await, Err(LockError::NotHeld { .. })),
        "the old holder learns of the loss at its next renew"
    );
    assert_eq!(a.release(&old).await.unwrap(), ReleaseOutcome::NotHeld);
    resource.write(new.fence(), |v| *v += 1).unwrap();
    assert!(resource.write(old.fence(), |v| *v += 1).is_err(), "C1");

    // Back to real time: B's lease now looks an hour longer on the store.
    store.set_clock_offset(0).unwrap();
    let left = a
        .inspect(&lock)
        .await
        .unwrap()
        .and_then(|h| h.expires_in)
        .expect("B still holds");
    assert!(left > Duration::from_secs(3600), "{left:?}");
    assert!(matches!(
        a.try_acquire_for(&lock, Duration::from_secs(5))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(b.release(&new).await.unwrap(), ReleaseOutcome::Released);
    let after = acquired(&a, &lock, Duration::from_secs(5)).await;
    assert!(after.fence() > new.fence());
}

#[tokio::test]
async fn a_floor_past_the_counter_is_refused_before_any_io() {
    let store = postgres::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let op_timeout = scaled(Duration::from_secs(2));
    let url = format!(
        "{}?timeout={}ms",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let client = PostgresBackend::connect(&url).await.unwrap();
    let caps = client.capabilities();
    assert_eq!(caps.max_fence, i64::MAX.unsigned_abs(), "a bigint sequence");
    let largest = caps.max_fence_floor();
    assert_eq!(largest, caps.max_fence - Capabilities::FENCE_FLOOR_HEADROOM);
    // Any I/O would now hang until the operation timeout.
    proxy.set(Mode::Blackhole);
    for floor in [largest + 1, i64::MAX.unsigned_abs(), u64::MAX] {
        let floor = FencingToken::new(floor).unwrap();
        let started = Instant::now();
        let refused = client.raise_fence_floor(floor).await;
        let audited = lockcore::admin::raise_fence_floor(&client, floor).await;
        for outcome in [&refused, &audited] {
            assert!(
                matches!(outcome, Err(LockError::InvalidConfig { .. })),
                "floor {floor}: {outcome:?}"
            );
        }
        assert!(
            started.elapsed() < op_timeout / 2,
            "floor {floor} refused after {:?}: it went to the server",
            started.elapsed()
        );
    }
    proxy.set(Mode::Pass);
    let next = acquired(
        &backend(&shared_url()).await,
        &lock_name("unmoved"),
        Duration::from_secs(5),
    )
    .await;
    assert!(
        next.fence().get() < largest / 2,
        "a refused floor moved the next fence to {}",
        next.fence()
    );
}

/// On a server of its own (the floor moves its one sequence for good).
#[tokio::test]
async fn the_largest_floor_accepted_still_grants() {
    let store = postgres::start(Options::default()).expect("private postgres");
    let client = backend(&store.url()).await;
    let floor = FencingToken::new(client.capabilities().max_fence_floor()).unwrap();
    client.raise_fence_floor(floor).await.unwrap();
    let ttl = client
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    let mut last = floor;
    for i in 0..3 {
        let lock = acquired(&client, &lock_name(&format!("top-{i}")), ttl.get()).await;
        let permit = client
            .try_acquire_permit(&LockRequest::new(lock_name(&format!("slot-{i}")), ttl), 2)
            .await
            .unwrap()
            .into_lease()
            .expect("a free permit");
        for lease in [&lock, &permit] {
            assert!(lease.fence() > last, "{} after {last}", lease.fence());
            last = lease.fence();
            client.renew(lease).await.unwrap();
            client.release(lease).await.unwrap();
        }
    }
}

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

/// One failover moves the fences once. A client whose new connection finds
/// another timeline recorded than its server's, but whose locked look (it
/// waited for grants to pause) finds the server's timeline recorded
/// meanwhile, by a client that handled the failover first, neither raises
/// the fence floor again nor starts another lock delay: its grant follows
/// at once, with a fence that did not jump to the server's clock.
#[tokio::test]
async fn a_failover_another_client_recorded_first_is_not_handled_again() {
    let (table, app) = (unique("tl"), unique("tlapp"));
    let delay = scaled(Duration::from_secs(20));
    let url = with_params(
        &shared_url(),
        &format!(
            "table={table}&application_name={app}&failover_lock_delay={}ms",
            delay.as_millis()
        ),
    );
    let first = connect(&url).await;
    let lock = name("one-failover");
    let lease = acquired(&first, &lock, Duration::from_secs(5)).await;
    first.release(&lease).await.unwrap();
    // Closed, so no connection of its own (its eviction listener opens one
    // after its first grant) can handle the failover below first and
    // record a lock delay: only the handler of this test does.
    first.close().await.unwrap();
    // A failover, as the table sees it: another timeline recorded than
    // the server's.
    let mut admin = sql_conn(&shared_url()).await;
    let timeline: String =
        sqlx::query_scalar("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    let epoch = format!("public.{table}_epoch");
    sqlx::query(&format!(
        "UPDATE {epoch} SET timeline = 'FFFFFFFF' WHERE id"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    // Grants paused, as the client handling it first pauses them.
    let mut other = sql_conn(&shared_url()).await;
    let mut first_handler = sqlx::Connection::begin(&mut other).await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE public.{table}, public.{table}_permits IN EXCLUSIVE MODE"
    ))
    .execute(&mut *first_handler)
    .await
    .unwrap();
    let second = tokio::spawn({
        let (url, lock) = (url.clone(), lock.clone());
        async move {
            let client = connect(&url).await;
            let lease = acquired(&client, &lock, Duration::from_secs(5)).await;
            (Instant::now(), lease)
        }
    });
    eventually(
        scaled(Duration::from_secs(10)),
        "the second client's check waiting for grants to pause",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event_type = 'Lock'",
            )
            .bind(&app)
            .fetch_one(&mut sql_conn(&shared_url()).await)
            .await
            .unwrap();
            (waiting > 0).then_some(())
        },
    )
    .await;
    // The first handler records the server's timeline and lets grants go.
    sqlx::query(&format!("UPDATE {epoch} SET timeline = $1 WHERE id"))
        .bind(&timeline)
        .execute(&mut *first_handler)
        .await
        .unwrap();
    first_handler.commit().await.unwrap();
    let let_go = Instant::now();
    let (granted, lease) = second.await.unwrap();
    assert!(
        granted - let_go < delay / 2,
        "granted {:?} after grants resumed: a second lock delay ({delay:?}) was started",
        granted - let_go
    );
    assert!(
        lease.fence().get() < 1_000_000_000,
        "fence {} after one failover handled by another client: the floor was raised again",
        lease.fence()
    );
}
