//! PostgreSQL: lease-table lock cycles next to the server's floor measured in
//! the same run (two `SELECT 1` round trips on one connection, and a session
//! advisory lock + unlock), then N-way contention four ways, in alternating
//! slices: the adapter as shipped (turnstiles: waiters queue in the
//! server's lock manager, one asks for the lease), the adapter with
//! turnstiles off (every instance's waiter woken by LISTEN/NOTIFY), the
//! adapter polling with backoff, and blocking `pg_advisory_lock` (the
//! server's own FIFO queue, no lease: the floor).

use std::sync::Arc;
use std::time::Duration;

use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    OwnerToken, ReleaseOutcome, WaitPolicy, Wakeup, async_trait,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Row};

const BACKEND: &str = "postgres";

pub async fn run(settings: &Settings) -> Vec<Row> {
    let store = lock_conformance::stores::postgres::shared();
    let url = store.url();
    let note = if store.is_external() {
        format!("server {}", store.addr())
    } else {
        "launched server, fsync on".to_string()
    };
    let mut rows = Vec::new();

    // Floors: the same client library, one dedicated connection, prepared statements.
    let conn = Mutex::new(PgConnection::connect(&url).await.expect("connect floor"));
    let select = harness::timed(settings.warmup, settings.run, || async {
        let mut c = conn.lock().await;
        for _ in 0..2 {
            sqlx::query("SELECT 1")
                .execute(&mut *c)
                .await
                .expect("SELECT 1");
        }
    })
    .await;
    rows.push(Row::new(BACKEND, "floor: 2x SELECT 1 (one connection)", &select).note(note.clone()));
    let advisory = harness::timed(settings.warmup, settings.run, || async {
        let mut c = conn.lock().await;
        sqlx::query("SELECT pg_advisory_lock(42)")
            .execute(&mut *c)
            .await
            .expect("advisory lock");
        sqlx::query("SELECT pg_advisory_unlock(42)")
            .execute(&mut *c)
            .await
            .expect("advisory unlock");
    })
    .await;
    rows.push(Row::new(
        BACKEND,
        "floor: pg_advisory_lock + unlock",
        &advisory,
    ));

    // A durable lock cycle commits twice (acquire, release), and each commit
    // waits for its WAL flush: two single-row UPDATE commits are the floor
    // of any lock that survives a crash.
    {
        let mut c = conn.lock().await;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS distlock_bench_floor (k int PRIMARY KEY, v bigint NOT NULL)",
        )
        .execute(&mut *c)
        .await
        .expect("floor table");
        sqlx::query("INSERT INTO distlock_bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING")
            .execute(&mut *c)
            .await
            .expect("floor row");
    }
    let backend = PostgresBackend::connect(&url).await.expect("connect");
    // The adapter's statements go through a sqlx pool (like any sqlx user's):
    // this floor shows what the pool itself costs per round trip.
    let pool = backend.pool().clone();
    let pooled = harness::timed(settings.warmup, settings.run, || async {
        for _ in 0..2 {
            sqlx::query("SELECT 1")
                .execute(&pool)
                .await
                .expect("SELECT 1");
        }
    })
    .await;
    rows.push(Row::new(BACKEND, "floor: 2x SELECT 1 (sqlx pool)", &pooled));

    // The durable floor and the lock cycle run in alternating slices: WAL
    // flush time swings with other I/O on the machine, and both must see
    // the same disk for their ratio to mean anything.
    const SLICES: u32 = 6;
    let slice = settings.run / SLICES;
    let name = LockName::new("bench/postgres").unwrap();
    let client: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let (mut durable, mut cycles) = (harness::Stats::default(), harness::Stats::default());
    for i in 0..SLICES {
        let warmup = if i == 0 {
            settings.warmup
        } else {
            Duration::ZERO
        };
        let floor = harness::timed(warmup, slice, || async {
            let mut c = conn.lock().await;
            for _ in 0..2 {
                sqlx::query("UPDATE distlock_bench_floor SET v = v + 1 WHERE k = 1")
                    .execute(&mut *c)
                    .await
                    .expect("UPDATE");
            }
        })
        .await;
        merge(&mut durable, floor);
        let lock = harness::uncontended(client.clone(), &name, settings.ttl, warmup, slice).await;
        merge(&mut cycles, lock);
    }
    rows.push(Row::new(
        BACKEND,
        "floor: 2x durable UPDATE commit",
        &durable,
    ));
    rows.push(
        Row::new(BACKEND, "uncontended acquire+release", &cycles).note(format!(
            "{:.2}x the SELECT floor, {:.2}x the durable floor",
            cycles.per_sec() / select.per_sec(),
            cycles.per_sec() / durable.per_sec()
        )),
    );

    // N-way contention, four ways, each client an independent backend
    // instance (own pool, listener and turnstile connections, like N
    // processes). The scenarios run in alternating slices, like the
    // durable floor above: on a shared machine, load swings over seconds,
    // and the rows are only comparable if they saw the same load.
    let n = settings.contenders;
    let no_turnstiles = format!(
        "{url}{}lock_turnstiles=0",
        if url.contains('?') { '&' } else { '?' }
    );
    let mut scenarios: Vec<Scenario> = [
        ("turnstile + LISTEN/NOTIFY", "bench/postgres/turnstile"),
        (
            "LISTEN/NOTIFY only (lock_turnstiles=0)",
            "bench/postgres/notify",
        ),
        ("polling, backoff 10 ms..1 s", "bench/postgres/poll"),
        (
            "floor: blocking pg_advisory_lock",
            "bench/postgres/advisory",
        ),
    ]
    .into_iter()
    .map(|(label, name)| Scenario {
        label,
        name: LockName::new(name).unwrap(),
        clients: Vec::new(),
        waits: Arc::new(std::sync::Mutex::new(Vec::new())),
        handoffs: harness::Stats::default(),
        fifo: Vec::new(),
    })
    .collect();
    for _ in 0..n {
        let turnstile = PostgresBackend::connect(&url)
            .await
            .expect("connect contender");
        let notify = PostgresBackend::connect(&no_turnstiles)
            .await
            .expect("connect contender");
        let conn = PgConnection::connect(&url)
            .await
            .expect("connect advisory contender");
        let clients: [Arc<dyn LockBackend>; 4] = [
            Arc::new(turnstile),
            Arc::new(notify.clone()),
            Arc::new(Polling(notify)),
            Arc::new(Advisory(Mutex::new(conn))),
        ];
        for (scenario, inner) in scenarios.iter_mut().zip(clients) {
            let waits = scenario.waits.clone();
            scenario
                .clients
                .push(Arc::new(Waits { inner, waits }) as Arc<dyn LockBackend>);
        }
    }
    for _ in 0..SLICES {
        for scenario in &mut scenarios {
            let contended = harness::contended(
                scenario.clients.clone(),
                &scenario.name,
                settings.ttl,
                slice,
            )
            .await;
            scenario
                .fifo
                .push((contended.fifo_share, contended.handoffs.samples.len()));
            merge(&mut scenario.handoffs, contended.handoffs);
        }
    }
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    for scenario in scenarios {
        let waited = harness::Stats {
            elapsed: settings.run,
            samples: scenario.waits.lock().unwrap().clone(),
        };
        let grants: usize = scenario.fifo.iter().map(|(_, g)| g).sum();
        let fifo = scenario
            .fifo
            .iter()
            .map(|(share, g)| share * *g as f64)
            .sum::<f64>()
            / grants.max(1) as f64;
        rows.push(
            Row::new(
                BACKEND,
                format!("{n}-way contended, {}", scenario.label),
                &scenario.handoffs,
            )
            .note(format!(
                "FIFO share {:.0}%, acquire wait p50 {:.1} ms p99 {:.1} ms",
                fifo * 100.0,
                ms(waited.percentile(0.5)),
                ms(waited.percentile(0.99)),
            )),
        );
    }
    rows
}

/// One contended scenario, accumulated over its slices.
struct Scenario {
    label: &'static str,
    name: LockName,
    clients: Vec<Arc<dyn LockBackend>>,
    waits: Arc<std::sync::Mutex<Vec<Duration>>>,
    handoffs: harness::Stats,
    /// (FIFO share, hand-offs) of each slice.
    fifo: Vec<(f64, usize)>,
}

fn merge(into: &mut harness::Stats, from: harness::Stats) {
    into.elapsed += from.elapsed;
    into.samples.extend(from.samples);
}

/// Records how long each waiting `acquire` took: hand-off latency alone
/// hides starvation (a releaser that re-acquires at once makes hand-offs
/// fast while the others wait).
#[derive(Debug)]
struct Waits {
    inner: Arc<dyn LockBackend>,
    waits: Arc<std::sync::Mutex<Vec<Duration>>>,
}

#[async_trait]
impl LockBackend for Waits {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Attempt, LockError> {
        self.inner.try_acquire(name, ttl).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        self.inner.inspect(name).await
    }
    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.evict(name, expected).await
    }
    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch(name).await
    }
    async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let started = Instant::now();
        let lease = self.inner.acquire(name, ttl, wait).await;
        if let Ok(Some(_)) = &lease {
            self.waits.lock().unwrap().push(started.elapsed());
        }
        lease
    }
}

/// The adapter with its notifications hidden, so waiters poll with the
/// default jittered backoff: the baseline LISTEN/NOTIFY must beat.
#[derive(Debug)]
struct Polling(PostgresBackend);

#[async_trait]
impl LockBackend for Polling {
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities().notifications(false)
    }
    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Attempt, LockError> {
        self.0.try_acquire(name, ttl).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.0.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.0.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        self.0.inspect(name).await
    }
    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.0.evict(name, expected).await
    }
    async fn watch(&self, _name: &LockName) -> Result<Option<Wakeup>, LockError> {
        Ok(None)
    }
}

/// A session advisory lock on one connection per client, waiting in the
/// server's queue (`pg_advisory_lock` blocks): the hand-off floor. Bench
/// only: no fence, no TTL, lock-lifetime = connection-lifetime.
#[derive(Debug)]
struct Advisory(Mutex<PgConnection>);

const ADVISORY_KEY: i64 = 4242;

fn advisory_lease(name: &LockName, sent: Instant) -> Lease {
    Lease::new(
        name.clone(),
        OwnerToken::new(),
        FencingToken::new(1).expect("non-zero"),
        Duration::from_secs(3600),
        sent,
    )
}

fn sql_error(e: sqlx::Error) -> LockError {
    LockError::unavailable(BACKEND, e)
}

#[async_trait]
impl LockBackend for Advisory {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("pg-advisory")
    }
    async fn try_acquire(&self, name: &LockName, _ttl: Duration) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(ADVISORY_KEY)
            .fetch_one(&mut *self.0.lock().await)
            .await
            .map_err(sql_error)?;
        Ok(if got {
            Attempt::Acquired(advisory_lease(name, sent))
        } else {
            Attempt::Held { expires_in: None }
        })
    }
    async fn acquire(
        &self,
        name: &LockName,
        _ttl: Duration,
        _wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let sent = Instant::now();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(ADVISORY_KEY)
            .execute(&mut *self.0.lock().await)
            .await
            .map_err(sql_error)?;
        Ok(Some(advisory_lease(name, sent)))
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        Ok(lease.clone())
    }
    async fn release(&self, _lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(ADVISORY_KEY)
            .execute(&mut *self.0.lock().await)
            .await
            .map_err(sql_error)?;
        Ok(ReleaseOutcome::Released)
    }
    async fn inspect(&self, _name: &LockName) -> Result<Option<Holder>, LockError> {
        Err(LockError::Unsupported {
            backend: "pg-advisory",
            operation: "inspect",
        })
    }
    async fn evict(
        &self,
        _name: &LockName,
        _expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        Err(LockError::Unsupported {
            backend: "pg-advisory",
            operation: "evict",
        })
    }
}
