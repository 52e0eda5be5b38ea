//! Connecting: it fails fast and says why (a closed port, a wrong password
//! and a missing database each give an error naming the cause within the
//! configured connect timeout, never a bare "pool timed out"); a caller's
//! pool works; what connect reports (durability, Debug) is true and
//! secret-free.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{acquired, connect, lock_name as name, scaled, shared_url, sql_conn};
use lock_conformance::kit::poll::until;
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_postgres::testing;
use lock_postgres::{PostgresBackend, PostgresConfig};
use lockcore::{FenceDurability, LockBackend, LockError, Locker};
use tokio::time::Instant;

/// The connect timeout the tests configure, and the bound on how long a
/// failed connect may take: the timeout plus scheduling on a loaded
/// machine, scaled by `LOCK_TEST_TIME_SCALE`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn bound() -> Duration {
    scaled(CONNECT_TIMEOUT + Duration::from_millis(500))
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
    let store = postgres::start(Options::default().password_auth(true)).expect("private postgres");
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
        testing::waiting(&backend) == 1
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
    let url = format!("postgres://locker:pa55-w0rd@127.0.0.1:{port}/db?timeout=300ms");
    let started = Instant::now();
    let err = PostgresBackend::connect(&url).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        started.elapsed() < scaled(Duration::from_secs(5)),
        "{:?}",
        started.elapsed()
    );
    let shown = format!(
        "{err} {err:?} {:?}",
        PostgresConfig::from_url(&url).unwrap()
    );
    assert!(!shown.contains("pa55-w0rd"), "{shown}");
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

/// `client()` is sqlx's own pool on the backend's server, for the
/// application's statements (here a fenced write in its own transaction):
/// one made on first use, which `close` closes; or, under `from_pool`, the
/// caller's pool, which `close` leaves open.
#[tokio::test]
async fn client_is_a_sqlx_pool_on_the_backends_server() {
    let backend = PostgresBackend::connect(&shared_url()).await.unwrap();
    let pool = backend.client();
    let port: String = sqlx::query_scalar("SELECT current_setting('port')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(port, postgres::shared().addr().port().to_string());
    let lease = acquired(&backend, &name("client"), Duration::from_secs(30)).await;
    let mut tx = pool.begin().await.unwrap();
    let resource = format!("client-{}", lease.name());
    backend
        .resource_fence()
        .write(&mut tx, &resource, lease.fence())
        .await
        .unwrap()
        .expect("the holder's write is not stale");
    tx.commit().await.unwrap();
    backend.release(&lease).await.unwrap();
    backend.close().await.unwrap();
    assert!(pool.is_closed(), "close closes the pool it made");

    let caller = sqlx::PgPool::connect(&shared_url()).await.unwrap();
    let backend = PostgresBackend::from_pool(caller.clone()).await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&backend.client())
        .await
        .unwrap();
    assert_eq!(one, 1);
    backend.close().await.unwrap();
    assert!(!caller.is_closed(), "the caller's pool stays open");
}
