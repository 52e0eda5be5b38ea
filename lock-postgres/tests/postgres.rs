//! PostgreSQL-specific behaviour, against real servers from the conformance
//! harness: the shared one for ordinary tests, private ones for crashes and
//! clock steps.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::stores::postgres::{self, Options};
use lock_conformance::stores::until;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_postgres::{FenceError, PostgresBackend, PostgresConfig, ResourceFence, fence_check};
use lockcore::backend::LockBackendExt;
use lockcore::{
    Attempt, Backoff, FenceDurability, FencedResource, Lease, LockBackend, LockError, LockName,
    Locker, ReleaseOutcome,
};
use tokio::time::Instant;

fn shared_url() -> String {
    postgres::shared().url()
}

/// `url` with extra query parameters.
fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A fresh identifier, for tests that need their own schema or table.
fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

fn name(s: &str) -> LockName {
    LockName::new(format!("{}/{s}", unique("pgtest"))).unwrap()
}

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(PostgresBackend::connect(url).await.expect("connect"))
}

async fn acquired(client: &Arc<dyn LockBackend>, name: &LockName, ttl: Duration) -> Lease {
    match client
        .try_acquire_for(name, ttl)
        .await
        .expect("try_acquire")
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should be free"),
    }
}

async fn sql_conn(url: &str) -> PgConnection {
    PgConnection::connect(url).await.expect("plain connection")
}

/// T4.6: hostile schema and table options are refused before any I/O, and
/// a hostile lock name is only ever data.
#[tokio::test]
async fn sql_injection_in_options_is_refused_and_names_are_data() {
    let url = shared_url();
    for (option, value) in [
        ("lock_table", "locks\"; DROP TABLE x; --"),
        ("lock_schema", "public\"; DROP SCHEMA public CASCADE; --"),
        ("lock_table", "a b"),
        ("lock_schema", "1x"),
    ] {
        let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        let err = PostgresBackend::connect(&with_params(&url, &format!("{option}={encoded}")))
            .await
            .expect_err(value);
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{value}: {err:?}"
        );
        assert!(
            err.to_string().contains("not a safe SQL identifier"),
            "{err}"
        );
    }

    let table = unique("victims");
    let mut conn = sql_conn(&url).await;
    sqlx::query(&format!("CREATE TABLE {table} (id int)"))
        .execute(&mut conn)
        .await
        .unwrap();
    let client = connect(&url).await;
    let hostile = LockName::new(format!(
        "'; DROP TABLE {table}; -- \" ); DELETE FROM distlock_locks; --"
    ))
    .unwrap();
    let lease = acquired(&client, &hostile, Duration::from_secs(30)).await;
    let other = connect(&url).await;
    assert!(matches!(
        other
            .try_acquire_for(&hostile, Duration::from_secs(30))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(
        other.inspect(&hostile).await.unwrap().map(|h| h.fence),
        Some(lease.fence())
    );
    assert_eq!(
        client.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let survived: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(survived, "the table named in the lock name must survive");
    let stored: String =
        sqlx::query_scalar("SELECT name FROM public.distlock_locks WHERE name = $1")
            .bind(hostile.as_str())
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(stored, hostile.as_str(), "names are stored verbatim");
}

/// Eight backends connecting at once to a schema nobody created yet: all
/// succeed, the objects exist once, and they share one fence sequence.
#[tokio::test]
async fn concurrent_first_use_creates_the_schema_once() {
    let url = shared_url();
    let schema = unique("Locks");
    let config = PostgresConfig::from_url(&url)
        .unwrap()
        .schema(&schema)
        .table("Leases");
    let connecting: Vec<_> = (0..8)
        .map(|_| tokio::spawn(PostgresBackend::connect_with(config.clone())))
        .collect();
    let mut backends = Vec::new();
    for task in connecting {
        backends.push(task.await.unwrap().expect("concurrent connect"));
    }
    assert_eq!(backends[0].table(), format!("\"{schema}\".\"Leases\""));
    let mut conn = sql_conn(&url).await;
    let objects: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = $1 AND c.relname IN ('Leases', 'Leases_fence_seq', 'resource_fence')",
    )
    .bind(&schema)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(objects, 3);
    let lock = name("shared-sequence");
    let mut last = 0;
    for backend in &backends {
        let lease = match backend
            .try_acquire_for(&lock, Duration::from_secs(5))
            .await
            .unwrap()
        {
            Attempt::Acquired(lease) => lease,
            other => panic!("{other:?}"),
        };
        assert!(lease.fence().get() > last, "fences grow across instances");
        last = lease.fence().get();
        backend.release(&lease).await.unwrap();
    }
}

/// With `create_schema` off, a missing table is a configuration error that
/// says what to do, not a failure at first use.
#[tokio::test]
async fn missing_objects_without_create_schema_are_a_config_error() {
    let url = with_params(
        &shared_url(),
        &format!("lock_table={}&lock_create_schema=false", unique("absent")),
    );
    let err = PostgresBackend::connect(&url).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("create_schema"), "{err}");
}

/// An operator who drops the fence sequence cannot make fences go back: the
/// re-created sequence starts above every fence left in the table.
#[tokio::test]
async fn recreated_sequence_starts_above_existing_fences() {
    let table = unique("resync");
    let url = with_params(&shared_url(), &format!("lock_table={table}"));
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

/// T2.5 / T4.10: 2,000 waiters on one backend share its pool, its single
/// LISTEN connection and two turnstile connections (they wait for one name:
/// one line in the instance, whose first waiter alone queues at the server,
/// behind the lease of the previous one), and every one of them is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_share_one_listener() {
    const WAITERS: usize = 2000;
    const POOL: u32 = 4;
    let app = unique("waiters");
    let url = with_params(
        &shared_url(),
        &format!("application_name={app}&lock_pool_size={POOL}"),
    );
    let holder = connect(&shared_url()).await;
    let lock = name("crowd");
    let first = acquired(&holder, &lock, Duration::from_secs(60)).await;
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(240))
        // Long re-checks: waiters must be woken by NOTIFY, not by polling.
        .recheck(Duration::from_secs(30))
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(2),
        ));
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, lock, served) = (locker.clone(), lock.clone(), served.clone());
            tokio::spawn(async move {
                let guard = locker.acquire(&lock).await.expect("every waiter is served");
                served.lock().unwrap().push(guard.fencing_token());
                guard.release().await.expect("release");
            })
        })
        .collect();
    until(
        Duration::from_secs(60),
        "2,000 registered waiters",
        || async { backend.waiting() == WAITERS },
    )
    .await;
    let mut conn = sql_conn(&shared_url()).await;
    let connections: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(
        connections <= i64::from(POOL) + 3,
        "{connections} connections for {WAITERS} waiters (pool {POOL} + 1 listener + 2 turnstiles)"
    );
    let released = Instant::now();
    holder.release(&first).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let fences = served.lock().unwrap().clone();
    assert_eq!(fences.len(), WAITERS);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences grow in grant order"
    );
    assert!(fences[0] > first.fence());
    eprintln!(
        "{WAITERS} hand-offs in {:?} over {connections} connections",
        released.elapsed()
    );
    assert_eq!(backend.waiting(), 0, "no registration outlives its waiter");
}

/// The listener connection is killed while a waiter waits: it reconnects,
/// re-listens, and the next release still wakes the waiter by notification
/// (re-checks are 30 s apart, so polling cannot explain a prompt grant).
#[tokio::test]
async fn listener_reconnects_after_its_connection_is_killed() {
    let app = unique("relisten");
    let url = with_params(&shared_url(), &format!("application_name={app}"));
    let holder = connect(&shared_url()).await;
    let lock = name("relisten");
    let lease = acquired(&holder, &lock, Duration::from_secs(60)).await;
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(60))
        .recheck(Duration::from_secs(30))
        .backoff(Backoff::new(
            Duration::from_secs(30),
            Duration::from_secs(30),
        ));
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { locker.acquire(&lock).await.map(|g| (g, Instant::now())) }
    });
    let mut conn = sql_conn(&shared_url()).await;
    // The waiter starts the listener when it first waits.
    let give_up = Instant::now() + Duration::from_secs(10);
    let old = loop {
        if let Some(pid) = listener_pid(&mut conn, &app).await {
            break pid;
        }
        assert!(Instant::now() < give_up, "no LISTEN connection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(backend.waiting(), 1);
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(old)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(killed);
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        match listener_pid(&mut conn, &app).await {
            Some(pid) if pid != old => break,
            _ => assert!(Instant::now() < give_up, "the listener did not come back"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (guard, granted) = waiter.await.unwrap().expect("the waiter gets the lock");
    let lag = granted - released;
    assert!(
        lag < Duration::from_secs(2),
        "woken {lag:?} after the release"
    );
    assert!(guard.fencing_token() > lease.fence());
    guard.release().await.unwrap();
}

/// The backend pid of the LISTEN connection of application `app`.
async fn listener_pid(conn: &mut PgConnection, app: &str) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(app)
    .fetch_optional(conn)
    .await
    .unwrap()
}

/// The worked example of the README: an inventory decrement guarded by
/// `fence_check` in the same transaction. A stale holder's decrement is
/// refused and rolled back; the current holder may write repeatedly.
#[tokio::test]
async fn fence_check_guards_the_inventory_decrement() {
    let url = shared_url();
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let pool = backend.pool().clone();
    let inventory = unique("inventory");
    sqlx::query(&format!(
        "CREATE TABLE {inventory} (id bigint PRIMARY KEY, quantity int NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!("INSERT INTO {inventory} VALUES (42, 10)"))
        .execute(&pool)
        .await
        .unwrap();
    let decrement =
        format!("UPDATE {inventory} SET quantity = quantity - 1 WHERE id = $1 AND quantity > 0");
    let resource = unique("inventory:42");
    let client: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let lock = name("sku-42");

    // A holds the lock, is paused past its TTL, B takes over and writes.
    let old = acquired(&client, &lock, Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    let new = acquired(&client, &lock, Duration::from_secs(30)).await;
    assert!(new.fence() > old.fence());
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        fence_check(&mut tx, &resource, new.fence()).await.unwrap();
        sqlx::query(&decrement)
            .bind(42_i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    // A wakes up and tries its write with the old token: refused.
    let mut tx = pool.begin().await.unwrap();
    match fence_check(&mut tx, &resource, old.fence()).await {
        Err(FenceError::Stale(stale)) => {
            assert_eq!((stale.token, stale.highest), (old.fence(), new.fence()));
        }
        other => panic!("a stale token must be refused, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    let quantity: i32 =
        sqlx::query_scalar(&format!("SELECT quantity FROM {inventory} WHERE id = 42"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        quantity, 8,
        "only the current holder's two decrements applied"
    );

    let mut tx = pool.begin().await.unwrap();
    let huge = lockcore::FencingToken::new(u64::MAX).unwrap();
    assert!(matches!(
        fence_check(&mut tx, &resource, huge).await,
        Err(FenceError::OutOfRange(_))
    ));
    tx.rollback().await.unwrap();

    // A fence table elsewhere, created on demand.
    let schema = unique("fences");
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let custom = ResourceFence::new(&schema, "fence_marks").unwrap();
    custom.ensure_table(&mut conn).await.unwrap();
    drop(conn);
    let mut tx = pool.begin().await.unwrap();
    custom.check(&mut tx, &resource, old.fence()).await.unwrap();
    tx.commit().await.unwrap();
    assert!(ResourceFence::new("public", "x\"; --").is_err());
    client.release(&new).await.unwrap();
}

/// `purge_free` deletes long-free rows without letting fences go back.
#[tokio::test]
async fn purge_free_keeps_fences_monotonic() {
    let table = unique("purged");
    let url = with_params(&shared_url(), &format!("lock_table={table}"));
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let client: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let lock = name("purged");
    let held = name("still-held");
    let first = acquired(&client, &lock, Duration::from_secs(5)).await;
    client.release(&first).await.unwrap();
    let keep = acquired(&client, &held, Duration::from_secs(30)).await;
    assert_eq!(
        backend.purge_free(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    assert_eq!(backend.purge_free(Duration::ZERO).await.unwrap(), 1);
    let second = acquired(&client, &lock, Duration::from_secs(5)).await;
    assert!(second.fence() > first.fence());
    assert_eq!(
        client.inspect(&held).await.unwrap().map(|h| h.fence),
        Some(keep.fence()),
        "held rows are never purged"
    );
}

/// An existing pool works, and the listener does not take one of its slots.
#[tokio::test]
async fn from_pool_uses_the_callers_pool() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&shared_url())
        .await
        .unwrap();
    let backend = PostgresBackend::from_pool(pool.clone()).await.unwrap();
    let client: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let lock = name("pooled");
    let lease = acquired(&client, &lock, Duration::from_secs(10)).await;
    // A waiter (which starts the listener) and the holder's release both
    // need the single pooled connection: a listener inside the pool would
    // starve them.
    let waiter = tokio::spawn({
        let (client, lock) = (client.clone(), lock.clone());
        async move {
            Locker::from_arc(client)
                .max_wait(Duration::from_secs(10))
                .acquire(&lock)
                .await
        }
    });
    until(Duration::from_secs(5), "a registered waiter", || async {
        backend.waiting() == 1
    })
    .await;
    client.release(&lease).await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    assert!(guard.fencing_token() > lease.fence());
    guard.release().await.unwrap();
}

/// An unreachable server is a retryable error within the operation timeout,
/// and no error or Debug output shows the password.
#[tokio::test]
async fn unreachable_server_is_retryable_and_secret_free() {
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap().port()
    };
    let url = format!("postgres://locker:pa55-w0rd@127.0.0.1:{port}/db?lock_op_timeout_ms=300");
    let started = Instant::now();
    let err = PostgresBackend::connect(&url).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let shown = format!(
        "{err} {err:?} {:?}",
        PostgresConfig::from_url(&url).unwrap()
    );
    assert!(!shown.contains("pa55-w0rd"), "{shown}");
}

/// A connected backend whose server dies answers `Unavailable` (retryable)
/// within its operation timeout, and works again once the server is back.
#[tokio::test]
async fn server_crash_is_unavailable_then_recovers() {
    let store = postgres::start(Options::default()).expect("private postgres");
    let url = with_params(&store.url(), "lock_op_timeout_ms=1000");
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
    assert!(started.elapsed() < Duration::from_secs(3));
    store.restart_now().expect("restart on the same data");
    let give_up = Instant::now() + Duration::from_secs(10);
    let holder = loop {
        if let Ok(holder) = client.inspect(&lock).await {
            break holder;
        }
        assert!(Instant::now() < give_up, "no service after the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
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

/// Durability is reported from the server's real settings.
#[tokio::test]
async fn capabilities_report_the_servers_durability() {
    let client = connect(&shared_url()).await;
    let caps = client.capabilities();
    let mut conn = sql_conn(&shared_url()).await;
    let (fsync, sync_commit): (String, String) =
        sqlx::query_as("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let durable = fsync == "on" && sync_commit != "off";
    assert_eq!(
        caps.fence_durability == FenceDurability::Durable,
        durable,
        "fsync={fsync} synchronous_commit={sync_commit}: {caps:?}"
    );
    assert!(caps.notifications);
}

/// T4.15: a connected backend's `Debug` names the server, never the password.
#[tokio::test]
async fn debug_of_a_connected_backend_hides_the_password() {
    let url = shared_url();
    let Some(rest) = url.strip_prefix("postgres://postgres@") else {
        eprintln!("external server with its own credentials: the config unit tests cover Debug");
        return;
    };
    // The launched server trusts loopback, so any password connects.
    let with_password = format!("postgres://postgres:hunter2-pw@{rest}");
    let backend = PostgresBackend::connect(&with_password).await.unwrap();
    let shown = format!("{backend:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("postgres@127.0.0.1"), "{shown}");
}
