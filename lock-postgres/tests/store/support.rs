//! What the PostgreSQL tests share: the shared server's URL, unique names,
//! connecting, one-shot acquires, a plain SQL connection, the round-trip
//! allowance and `LOCK_TEST_TIME_SCALE`.

// The store binary uses all of it; tests/secrets.rs only a part.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection, PgPool};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, Backoff, Lease, LockBackend, LockError, LockGuard, LockName, Locker};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub(crate) use lock_conformance::kit::scaled;

/// The URL of this test binary's shared server.
pub(crate) fn shared_url() -> String {
    postgres::shared().url()
}

/// `url` with extra query parameters.
pub(crate) fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// `url` with every connection tagged `application_name=app`, so a test
/// can find its sessions in `pg_stat_activity`.
pub(crate) fn with_app(url: &str, app: &str) -> String {
    with_params(url, &format!("application_name={app}"))
}

/// A fresh identifier (schema, table, application name...).
pub(crate) fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A lock name no other test uses.
pub(crate) fn lock_name(s: &str) -> LockName {
    LockName::new(format!("{}/{s}", unique("pgtest"))).unwrap()
}

/// A backend on `url`.
pub(crate) async fn backend(url: &str) -> PostgresBackend {
    PostgresBackend::connect(url).await.expect("connect")
}

/// A backend on `url`, as the trait object the suite uses.
pub(crate) async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(backend(url).await)
}

/// `try_acquire` of a name that must be free.
pub(crate) async fn acquired<B: LockBackend + ?Sized>(
    client: &B,
    name: &LockName,
    ttl: Duration,
) -> Lease {
    match client
        .try_acquire_for(name, ttl)
        .await
        .expect("try_acquire")
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should be free"),
    }
}

/// Opens a pooled connection and prepares the acquire statement on it, so
/// a later acquire is sent in one go (sqlx would otherwise wait for the
/// reply to its Parse first, and a lost reply would mean nothing ran).
/// Then waits until the backend's background work on its single pooled
/// connection is over (its first grant starts the eviction LISTEN, and a
/// check of that grant), so nothing else is in flight when replies drop.
pub(crate) async fn warm_up(client: &PostgresBackend) {
    let name = lock_name("warm-up");
    let lease = match client.try_acquire_for(&name, Duration::from_secs(5)).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the free lock: {other:?}"),
    };
    until(Duration::from_secs(10), "the eviction LISTEN", || async {
        format!("{client:?}").contains("listening_for_evictions: true")
    })
    .await;
    client.release(&lease).await.unwrap();
    // Again, on the one connection (the check is over once it is free):
    // the acquire statement is prepared on it.
    match client.try_acquire_for(&name, Duration::from_secs(5)).await {
        Ok(Attempt::Acquired(lease)) => client.release(&lease).await.unwrap(),
        other => panic!("the free lock: {other:?}"),
    };
}

/// A plain connection, outside any backend.
pub(crate) async fn sql_conn(url: &str) -> PgConnection {
    PgConnection::connect(url).await.expect("plain connection")
}

/// A plain connection inside a transaction that holds the row lock of
/// `name` in `table` (`SELECT ... FOR UPDATE`), as a concurrent grant's
/// transaction would: writers of that row wait until it commits.
pub(crate) async fn row_locked(url: &str, table: &str, name: &LockName) -> PgConnection {
    let mut conn = sql_conn(url).await;
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM public.{table} WHERE name = $1 FOR UPDATE"
    ))
    .bind(name.as_str())
    .execute(&mut conn)
    .await
    .unwrap();
    conn
}

/// A round-trip allowance: four times the slowest of five `inspect` calls,
/// plus 250 ms, scaled.
pub(crate) async fn round_trip(client: &PostgresBackend) -> Duration {
    let probe = lock_name("round-trip");
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let sent = Instant::now();
        client.inspect(&probe).await.unwrap();
        slowest = slowest.max(sent.elapsed());
    }
    // A scheduling hiccup of the test process itself (other binaries run
    // beside it) is not the store's: a quarter second on top, scaled.
    scaled(slowest * 4 + Duration::from_millis(250))
}

/// Sessions of application `app`.
pub(crate) async fn sessions(conn: &mut PgConnection, app: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Sessions of application `app` that wait on `wait`: a `pg_stat_activity`
/// condition, e.g. `wait_event = 'PgSleep'` (in a slowing trigger) or
/// `wait_event_type = 'Lock'`.
pub(crate) async fn sessions_waiting(pool: &PgPool, app: &str, wait: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND {wait}"
    ))
    .bind(app)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A private server recording every statement, utility ones included.
pub(crate) fn counting_server() -> Store {
    postgres::start(
        Options::default()
            .setting("shared_preload_libraries", "pg_stat_statements")
            .setting("pg_stat_statements.track", "all")
            .setting("pg_stat_statements.track_utility", "on"),
    )
    .expect("private postgres with pg_stat_statements")
}

/// A connection to `store` that reads `pg_stat_statements`.
pub(crate) async fn counting_observer(store: &Store) -> PgConnection {
    let mut observer = PgConnection::connect(&store.url()).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut observer)
        .await
        .unwrap();
    observer
}

/// The server's CPU so far: the postmaster and its children (backends and
/// background processes), exited children included, from `/proc`.
pub(crate) fn server_cpu(store: &Store) -> Duration {
    let root = store.pid().expect("running");
    let ticks_per_sec = 100.0; // USER_HZ on Linux
    let stat = |pid: u32| -> Option<(u32, f64)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command (which may hold spaces) in parentheses.
        let rest = &text[text.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let ppid = f[1].parse().ok()?;
        let ticks: f64 = f[11..15].iter().filter_map(|v| v.parse::<f64>().ok()).sum();
        Some((ppid, ticks))
    };
    let mut ticks = stat(root).map_or(0.0, |(_, t)| t);
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok())
            && let Some((ppid, t)) = stat(pid)
            && ppid == root
        {
            ticks += t;
        }
    }
    Duration::from_secs_f64(ticks / ticks_per_sec)
}

/// `(statements, statements that wrote WAL, server time in statements)`
/// since the last reset among statements whose text matches `like`,
/// leaving out the observer's own queries.
pub(crate) async fn statements(observer: &mut PgConnection, like: &str) -> (i64, i64, f64) {
    let (calls, writes, ms): (i64, i64, f64) = sqlx::query_as(
        "SELECT coalesce(sum(calls), 0)::int8,
                coalesce(sum(calls) FILTER (WHERE wal_records > 0), 0)::int8,
                coalesce(sum(total_exec_time + total_plan_time), 0)::float8
           FROM pg_stat_statements
          WHERE query NOT LIKE '%pg_stat_statements%' AND query LIKE $1",
    )
    .bind(like)
    .fetch_one(&mut *observer)
    .await
    .unwrap();
    (calls, writes, ms)
}

pub(crate) async fn reset(observer: &mut PgConnection) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&mut *observer)
        .await
        .unwrap();
}

/// This process's CPU time so far (all threads), from `/proc/self/stat`.
pub(crate) fn client_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &text[text.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11..13].iter().map(|v| v.parse::<f64>().unwrap()).sum();
    Duration::from_secs_f64(ticks / 100.0)
}

/// This process's peak resident set (`VmHWM`), in bytes.
pub(crate) fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

// ---- turnstiles ----

/// The shared server's URL, with every connection tagged `app` so the
/// test can find its sessions.
pub(crate) fn app_url(app: &str, params: &str) -> String {
    format!("{}{params}", with_app(&shared_url(), app))
}

/// A locker whose waiters can only be woken by a notification or the
/// turnstile: re-checks and backoff are 30 s apart.
pub(crate) fn patient(backend: &PostgresBackend) -> Locker {
    Locker::new(backend.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(60))
        .recheck(Duration::from_secs(30))
        .backoff(Backoff::new(
            Duration::from_secs(30),
            Duration::from_secs(30),
        ))
}

pub(crate) fn spawn_acquire(
    locker: Locker,
    name: &LockName,
) -> JoinHandle<Result<LockGuard, LockError>> {
    let name = name.clone();
    tokio::spawn(async move { locker.acquire(&name).await })
}

/// Sessions of application `app`, as turnstiles see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sessions {
    /// All connections.
    pub total: i64,
    /// Blocked in the turnstile queue (waiting on an advisory lock).
    pub queued: i64,
    /// Holding a turnstile (idle, its session holding the advisory lock).
    pub holding: i64,
}

pub(crate) async fn turnstile_sessions(conn: &PgPool, app: &str) -> Sessions {
    let (total, queued, holding): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'),
                count(*) FILTER (WHERE state = 'idle' AND EXISTS (
                    SELECT 1 FROM pg_locks l
                     WHERE l.pid = a.pid AND l.locktype = 'advisory'
                       AND l.mode = 'ExclusiveLock' AND l.granted))
           FROM pg_stat_activity a WHERE application_name = $1",
    )
    .bind(app)
    .fetch_one(conn)
    .await
    .unwrap();
    Sessions {
        total,
        queued,
        holding,
    }
}

/// Waits (up to 10 s) until the sessions of `app` satisfy `check`.
pub(crate) async fn await_sessions(
    conn: &PgPool,
    app: &str,
    what: &str,
    check: impl Fn(Sessions) -> bool,
) -> Sessions {
    let check = &check;
    eventually(Duration::from_secs(10), what, || async move {
        Some(turnstile_sessions(conn, app).await).filter(|now| check(*now))
    })
    .await
}

/// A pool for looking at `pg_stat_activity`.
pub(crate) async fn observer() -> PgPool {
    PgPool::connect(&shared_url()).await.unwrap()
}
