//! Connecting fails fast and says why: a closed port, a wrong password and
//! a missing database each give an error naming the cause within the
//! configured connect timeout, never a bare "pool timed out".

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use lock_conformance::stores::postgres::{self, Options};
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_postgres::{PostgresBackend, PostgresConfig};
use lockcore::LockError;
use tokio::time::Instant;

/// The connect timeout the tests configure, and the bound on how long a
/// failed connect may take: the timeout plus scheduling on a loaded
/// machine, scaled by `LOCK_TEST_TIME_SCALE`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn bound() -> Duration {
    let scale = std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0);
    (CONNECT_TIMEOUT + Duration::from_millis(500)).mul_f64(scale)
}

/// Connects with a long operation timeout (which must not be what bounds a
/// failed connect) and the short connect timeout; returns the error and
/// how long it took.
async fn failed_connect(url: &str) -> (LockError, Duration) {
    let config = PostgresConfig::from_url(url)
        .unwrap()
        .op_timeout(Duration::from_secs(30))
        .connect_timeout(CONNECT_TIMEOUT);
    let started = Instant::now();
    let err = PostgresBackend::connect_with(config)
        .await
        .expect_err("connect must fail");
    (err, started.elapsed())
}

#[tokio::test]
async fn closed_port_says_connection_refused_at_once() {
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap().port()
    };
    let (err, took) = failed_connect(&format!("postgres://locker:pw@127.0.0.1:{port}/db")).await;
    let text = err.to_string();
    assert!(err.is_retryable(), "a refused connection may heal: {err:?}");
    assert!(text.contains("refused"), "the cause must be named: {text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(
        took <= bound(),
        "took {took:?}, bound {:?}: {text}",
        bound()
    );
}

#[tokio::test]
async fn wrong_password_and_missing_database_are_named_quickly() {
    // A server of its own that checks passwords (scram) for everyone but
    // `postgres`, which the launcher uses to check readiness.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let hba = dir.path().join("pg_hba.conf");
    let mut file = std::fs::File::create(&hba).unwrap();
    writeln!(
        file,
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         host all all 127.0.0.1/32 scram-sha-256"
    )
    .unwrap();
    drop(file);
    std::fs::set_permissions(&hba, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = postgres::start(
        Options::default().setting("hba_file", hba.to_str().expect("a UTF-8 temp path")),
    )
    .expect("private postgres");
    let mut admin = PgConnection::connect(&store.url()).await.unwrap();
    sqlx::query("CREATE ROLE locker LOGIN PASSWORD 'right-pw'")
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query("CREATE DATABASE locks OWNER locker")
        .execute(&mut admin)
        .await
        .unwrap();
    let addr = store.addr();

    // The right password works: the failures below are about what they say.
    let config = PostgresConfig::from_url(&format!("postgres://locker:right-pw@{addr}/locks"))
        .unwrap()
        .connect_timeout(CONNECT_TIMEOUT);
    PostgresBackend::connect_with(config)
        .await
        .expect("the right password connects");

    let (err, took) = failed_connect(&format!("postgres://locker:wrong-pw@{addr}/locks")).await;
    let text = err.to_string();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(!text.contains("wrong-pw"), "never the password: {text}");
    assert!(
        took <= bound(),
        "took {took:?}, bound {:?}: {text}",
        bound()
    );

    let (err, took) = failed_connect(&format!("postgres://locker:right-pw@{addr}/nowhere")).await;
    let text = err.to_string();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    assert!(
        text.contains("database \"nowhere\" does not exist"),
        "{text}"
    );
    assert!(
        took <= bound(),
        "took {took:?}, bound {:?}: {text}",
        bound()
    );
}

/// A server that accepts the connection but never answers is reported
/// within the connect timeout, not the (longer) operation timeout.
#[tokio::test]
async fn silent_server_times_out_at_the_connect_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let (err, took) = failed_connect(&format!("postgres://locker:pw@127.0.0.1:{port}/db")).await;
    let text = err.to_string();
    assert!(err.is_retryable(), "{err:?}");
    assert!(text.contains(&format!("{CONNECT_TIMEOUT:?}")), "{text}");
    assert!(took >= CONNECT_TIMEOUT, "{took:?}");
    assert!(
        took <= bound(),
        "took {took:?}, bound {:?}: {text}",
        bound()
    );
    drop(silent);
}
