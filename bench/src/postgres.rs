//! PostgreSQL: lease-table lock cycles next to the server's floor with the
//! same durability (two single-row `UPDATE` commits, each waiting for its
//! WAL flush, on one connection) and session advisory locks
//! (`pg_advisory_lock` + unlock: no lease, no fence, gone with the
//! connection), uncontended and contended (blocking in the server's own
//! queue). Scale scenarios run on a server of their own and count what it
//! counts: the database's transactions (`pg_stat_database`), whatever sent
//! them. On that server, before them, a profile of the uncontended cycle
//! (`pg_stat_statements`) gives each statement's server time and WAL next
//! to the floor's `UPDATE`.

use std::sync::Arc;

use futures::FutureExt;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_postgres::{PostgresBackend, PostgresConfig};
use lockcore::LockBackend;
use lockcore::backend::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Client, Held, Shared, op};
use crate::lineup::{self, Lineup};
use crate::report::Report;
use crate::scale::{self, Pool, Probe};

const BACKEND: &str = "postgres";

pub(crate) async fn run(settings: Settings) -> Report {
    use lock_conformance::kit::stores::postgres as stores;
    let store = stores::shared();
    let mut report = server(BACKEND, &store.url(), &settings).await;
    let counted = counted_server(&store);
    if let Some(profile) = match &counted {
        Some(counted) => statement_profile(&counted.url(), &settings).await,
        None => None,
    } && let Some(row) = (report.rows.iter_mut()).find(|r| r.what.starts_with("2 x durable"))
    {
        row.note = format!(
            "{}; per statement (own server, pg_stat_statements): {profile}",
            row.note
        );
    }
    report.extend(scenarios(&settings, store, counted).await);
    // The lossless mode: a synchronous standby, each commit waiting for it.
    match synchronous_pair().await {
        Ok((primary, _standby)) => {
            report.extend(server("postgres + synchronous standby", &primary.url(), &settings).await)
        }
        Err(e) => report.failures.push(format!(
            "postgres with a synchronous standby not measured: {e}"
        )),
    }
    report
}

/// A primary whose commits wait for its standby (named in
/// `synchronous_standby_names`), once the standby is synchronous.
async fn synchronous_pair() -> std::io::Result<(
    lock_conformance::kit::stores::Store,
    lock_conformance::kit::stores::Store,
)> {
    use lock_conformance::kit::stores::postgres::{self as stores, Options};
    let primary =
        stores::start(Options::default().setting("synchronous_standby_names", "standby"))?;
    let standby = stores::start_standby(primary.addr(), Options::default())?;
    let mut conn = PgConnection::connect(&primary.url())
        .await
        .map_err(std::io::Error::other)?;
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let sync: Option<String> = sqlx::query_scalar(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'",
        )
        .fetch_optional(&mut conn)
        .await
        .map_err(std::io::Error::other)?;
        if sync.as_deref() == Some("sync") {
            return Ok((primary, standby));
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::other(
                "the standby did not become synchronous within 30 s",
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The lineup on the server at `url`: lock cycles next to its floors and
/// advisory locks, labelled `label`.
async fn server(label: &str, url: &str, settings: &Settings) -> Report {
    let conn = Arc::new(Mutex::new(
        PgConnection::connect(url).await.expect("connect floor"),
    ));
    let round_trip = harness::timed(
        &statements(&conn, "SELECT 1", 1),
        settings.warmup,
        settings.run / 2,
    )
    .await;
    {
        let mut c = conn.lock().await;
        for statement in [
            "CREATE TABLE IF NOT EXISTS distlock_bench_floor (k int PRIMARY KEY, v bigint NOT NULL)",
            "INSERT INTO distlock_bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING",
        ] {
            sqlx::query(statement)
                .execute(&mut *c)
                .await
                .expect("floor table");
        }
    }
    // The adapter's statements go through a sqlx pool (like any sqlx
    // user's): what the pool itself costs per round trip.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(PostgresConfig::DEFAULT_POOL_SIZE)
        .connect(url)
        .await
        .expect("pool");
    let pooled = op(move || {
        let pool = pool.clone();
        async move {
            for _ in 0..2 {
                sqlx::query("SELECT 1")
                    .execute(&pool)
                    .await
                    .expect("SELECT 1");
            }
        }
    });
    let mut contenders: Vec<Arc<dyn LockBackend>> = Vec::new();
    let mut advisory: Vec<Shared> = Vec::new();
    for _ in 0..settings.contenders {
        let b = PostgresBackend::connect(url)
            .await
            .expect("connect contender");
        contenders.push(Arc::new(b));
        advisory.push(Advisory::connect(url, 4242).await);
    }
    let lineup = Lineup {
        backend: label.into(),
        round_trip: Some(("SELECT 1".into(), round_trip)),
        floor: Some((
            "2 x durable single-row UPDATE commit (one connection)".into(),
            statements(
                &conn,
                "UPDATE distlock_bench_floor SET v = v + 1 WHERE k = 1",
                2,
            ),
        )),
        other_floors: vec![("2 x SELECT 1 through a sqlx pool".into(), pooled)],
        peers: vec![(
            "pg_advisory_lock + pg_advisory_unlock".into(),
            harness::cycle(Advisory::connect(url, 42).await),
        )],
        contended_peers: vec![("blocking pg_advisory_lock".into(), advisory)],
        backend_instance: Arc::new(PostgresBackend::connect(url).await.expect("connect")),
        contenders,
        floor_target: Some(0.9),
    };
    let mut report = lineup::measure(lineup, settings).await;
    let settings_of = |names: &'static [&'static str]| {
        let conn = conn.clone();
        async move {
            let mut out = Vec::new();
            for name in names {
                let value: String = sqlx::query_scalar(&format!("SHOW {name}"))
                    .fetch_one(&mut *conn.lock().await)
                    .await
                    .unwrap_or_else(|_| "?".into());
                out.push(format!("{name}={value}"));
            }
            out.join(", ")
        }
    };
    let version = settings_of(&["server_version"]).await;
    let durability = settings_of(&[
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_sync_method",
    ])
    .await;
    report.store(
        label,
        format!(
            "PostgreSQL {}",
            version.trim_start_matches("server_version=")
        ),
        format!("{durability}; the launcher's defaults"),
    );
    report
}

/// A server of the bench's own with `pg_stat_statements` (none when the
/// shared one is external, or this one cannot start): nobody else's
/// transactions in its count.
fn counted_server(
    shared: &lock_conformance::kit::stores::Store,
) -> Option<lock_conformance::kit::stores::Store> {
    use lock_conformance::kit::stores::postgres::{self as stores, Options};
    if shared.is_external() {
        return None;
    }
    stores::start(Options::default().setting("shared_preload_libraries", "pg_stat_statements"))
        .map_err(|e| {
            eprintln!("postgres: no server of the bench's own ({e}); counting on the shared one")
        })
        .ok()
}

/// Where an uncontended cycle's server time goes: uncontended
/// `try_acquire` + release cycles and floor `UPDATE`s on the server at
/// `url`, then each statement's mean executor time and WAL per call, as
/// `pg_stat_statements` counts them (commit and its WAL flush are outside
/// the executor time, and the same for all of them).
async fn statement_profile(url: &str, settings: &Settings) -> Option<String> {
    use lockcore::backend::LockBackendExt;
    let cycles = if settings.smoke { 20 } else { 2_000 };
    let mut conn = PgConnection::connect(url).await.ok()?;
    for statement in [
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
        "CREATE TABLE IF NOT EXISTS distlock_bench_floor (k int PRIMARY KEY, v bigint NOT NULL)",
        "INSERT INTO distlock_bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING",
    ] {
        sqlx::query(statement).execute(&mut conn).await.ok()?;
    }
    let backend = PostgresBackend::connect(url).await.ok()?;
    let name = lockcore::LockName::new("bench/profile").ok()?;
    for round in 0..2 {
        if round == 1 {
            sqlx::query("SELECT pg_stat_statements_reset()")
                .execute(&mut conn)
                .await
                .ok()?;
        }
        for _ in 0..cycles {
            let lease = (backend.try_acquire_for(&name, settings.ttl).await.ok()?).into_lease()?;
            backend.release(&lease).await.ok()?;
            sqlx::query("UPDATE distlock_bench_floor SET v = v + 1 WHERE k = 1")
                .execute(&mut conn)
                .await
                .ok()?;
        }
    }
    let rows: Vec<(String, i64, f64, f64, f64)> = sqlx::query_as(
        "SELECT query, calls, mean_exec_time::float8, wal_records::float8 / calls,
                wal_bytes::float8 / calls
           FROM pg_stat_statements WHERE calls >= $1 ORDER BY mean_exec_time DESC",
    )
    .bind(i64::from(cycles))
    .fetch_all(&mut conn)
    .await
    .ok()?;
    let kinds = [
        ("WITH cur AS", "acquire"),
        ("WITH released AS", "release"),
        ("UPDATE distlock_bench_floor", "floor UPDATE"),
    ];
    let parts: Vec<String> = (kinds.iter())
        .filter_map(|(prefix, kind)| {
            let (_, _, ms, records, bytes) =
                rows.iter().find(|r| r.0.trim_start().starts_with(prefix))?;
            Some(format!(
                "{kind} {:.1} µs, {records:.1} WAL records, {bytes:.0} B WAL",
                ms * 1000.0
            ))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The scale scenarios, on a server of their own (or on the shared one,
/// where that cannot start).
async fn scenarios(
    settings: &Settings,
    shared: Arc<lock_conformance::kit::stores::Store>,
    counted: Option<lock_conformance::kit::stores::Store>,
) -> Report {
    let store = counted.as_ref().unwrap_or(&*shared);
    let url = store.url();
    let mut conn = PgConnection::connect(&url).await.expect("probe connection");
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&mut conn)
        .await
        .unwrap_or(0);
    let probe = Server {
        conn: Mutex::new(conn),
        flushes_own: version >= FORCE_NEXT_FLUSH_SINCE,
        pid: (!store.is_external()).then(|| store.pid()).flatten(),
    };
    let pool_size = u64::from(PostgresConfig::DEFAULT_POOL_SIZE);
    let turnstiles = u64::from(PostgresConfig::DEFAULT_TURNSTILES);
    scale::run(
        BACKEND,
        || {
            let url = url.clone();
            async move {
                Arc::new(PostgresBackend::connect(&url).await.expect("connect"))
                    as Arc<dyn LockBackend>
            }
            .boxed()
        },
        &probe,
        Pool {
            size: pool_size + turnstiles + 1,
            what: format!("{pool_size} pooled + {turnstiles} turnstiles + 1 LISTEN"),
        },
        settings,
    )
    .await
}

/// `n` times `sql` on the one connection, as a timed operation.
fn statements(conn: &Arc<Mutex<PgConnection>>, sql: &'static str, n: usize) -> harness::Op {
    let conn = conn.clone();
    op(move || {
        let conn = conn.clone();
        async move {
            let mut c = conn.lock().await;
            for _ in 0..n {
                sqlx::query(sql).execute(&mut *c).await.expect(sql);
            }
        }
    })
}

/// The first PostgreSQL version with `pg_stat_force_next_flush()`.
const FORCE_NEXT_FLUSH_SINCE: i32 = 150_000;

/// How late PostgreSQL (15 and later) may count a transaction: a
/// connection reports its counters at most once a second while busy, and
/// 10 s after its last transaction once idle (`PGSTAT_IDLE_INTERVAL`); a
/// second more for scheduling.
const COUNT_LAG: std::time::Duration = std::time::Duration::from_secs(11);

/// A PostgreSQL server's own counters: the database's transactions,
/// committed or rolled back, as `pg_stat_database` counts them. Every
/// request a client makes is one (a statement outside a transaction block,
/// a pool's ping, a `LISTEN`), and so is the server's own upkeep of the
/// database (autovacuum).
struct Server {
    conn: Mutex<PgConnection>,
    /// Each reading reports its own transaction at once (PostgreSQL 15 and
    /// later), so the next reading counts it.
    flushes_own: bool,
    pid: Option<u32>,
}

#[async_trait]
impl Probe for Server {
    fn unit(&self) -> &'static str {
        "transactions (pg_stat_database)"
    }
    fn lag(&self) -> std::time::Duration {
        COUNT_LAG
    }
    async fn requests(&self) -> Option<u64> {
        let sql = if self.flushes_own {
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database, pg_stat_force_next_flush() \
             WHERE datname = current_database()"
        } else {
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()"
        };
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&mut *self.conn.lock().await)
            .await
            .ok()
            .map(|n| n.max(0) as u64)
    }
    async fn connections(&self) -> Option<u64> {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*)::bigint FROM pg_stat_activity \
             WHERE datname = current_database() AND backend_type = 'client backend'",
        )
        .fetch_one(&mut *self.conn.lock().await)
        .await
        .ok()
        .map(|n| n.max(0) as u64)
    }
    fn pid(&self) -> Option<u32> {
        self.pid
    }
}

/// A session advisory lock on one connection per client, waiting in the
/// server's queue (`pg_advisory_lock` blocks). No lease, no fence: the lock
/// lives as long as the connection.
struct Advisory {
    conn: Mutex<PgConnection>,
    key: i64,
}

impl Advisory {
    async fn connect(url: &str, key: i64) -> Shared {
        let conn = PgConnection::connect(url)
            .await
            .expect("connect advisory client");
        Arc::new(Advisory {
            conn: Mutex::new(conn),
            key,
        })
    }
}

#[async_trait]
impl Client for Advisory {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let mut conn = self.conn.lock().await;
        let locked = sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(self.key)
            .execute(&mut *conn);
        tokio::time::timeout_at(deadline, locked)
            .await
            .ok()?
            .expect("pg_advisory_lock");
        Some(Box::new(()))
    }

    async fn release(&self, _held: Held) {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .execute(&mut *self.conn.lock().await)
            .await
            .expect("pg_advisory_unlock");
    }
}
