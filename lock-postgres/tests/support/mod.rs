//! What the PostgreSQL tests share: the shared server's URL, unique names,
//! connecting, one-shot acquires, a plain SQL connection, the round-trip
//! allowance and `LOCK_TEST_TIME_SCALE`.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::stores::postgres;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, Lease, LockBackend, LockName};
use tokio::time::Instant;

/// `LOCK_TEST_TIME_SCALE` (default 1): timing bounds are multiplied by it
/// on slow machines.
pub fn scale() -> f64 {
    std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0)
}

/// `d` times [`scale`].
pub fn scaled(d: Duration) -> Duration {
    d.mul_f64(scale())
}

/// The URL of this test binary's shared server.
pub fn shared_url() -> String {
    postgres::shared().url()
}

/// `url` with extra query parameters.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// `url` with every connection tagged `application_name=app`, so a test
/// can find its sessions in `pg_stat_activity`.
pub fn with_app(url: &str, app: &str) -> String {
    with_params(url, &format!("application_name={app}"))
}

/// A fresh identifier (schema, table, application name...).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A lock name no other test uses.
pub fn lock_name(s: &str) -> LockName {
    LockName::new(format!("{}/{s}", unique("pgtest"))).unwrap()
}

/// A backend on `url`.
pub async fn backend(url: &str) -> PostgresBackend {
    PostgresBackend::connect(url).await.expect("connect")
}

/// A backend on `url`, as the trait object the suite uses.
pub async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(backend(url).await)
}

/// `try_acquire` of a name that must be free.
pub async fn acquired<B: LockBackend + ?Sized>(
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

/// A plain connection, outside any backend.
pub async fn sql_conn(url: &str) -> PgConnection {
    PgConnection::connect(url).await.expect("plain connection")
}

/// A round-trip allowance as the conformance suite computes it: four times
/// the slowest of three `inspect` calls, plus 100 ms, scaled.
pub async fn round_trip(client: &PostgresBackend) -> Duration {
    let probe = lock_name("round-trip");
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let sent = Instant::now();
        client.inspect(&probe).await.unwrap();
        slowest = slowest.max(sent.elapsed());
    }
    scaled(slowest * 4 + Duration::from_millis(100))
}

/// Sessions of application `app`.
pub async fn sessions(conn: &mut PgConnection, app: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_one(conn)
        .await
        .unwrap()
}
