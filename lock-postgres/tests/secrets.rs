//! The password never reaches anything this crate prints or returns: every
//! connect and error path is driven with the kit's marker password (`#/?@:%`
//! between two runs of letters), raw and percent-encoded, in the URL's user
//! info, in a `password=` parameter, in a libpq `key=value` string and
//! through `PostgresConfig::from_options`; against a closed port, a server
//! that asks for passwords (wrong, right, then changed under a connected
//! client), and as malformed URLs. Errors (`Display` and `Debug`), the
//! `Debug` of configs and backends, and everything logged through `tracing`
//! at any level must not show any of it.

/// Shared with the store binary.
#[path = "store/support.rs"]
mod support;

use std::time::Duration;

use lock_conformance::kit::secrets::{self, MARKER, assert_hidden, capture_tracing, captured};
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::sqlx::postgres::PgConnectOptions;
use lock_postgres::sqlx::{self, ConnectOptions, Connection, PgConnection};
use lock_postgres::{PostgresBackend, PostgresConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError, Locker};
use support::lock_name;

/// The marker as written raw and percent-encoded.
fn passwords() -> [String; 2] {
    [MARKER.to_owned(), secrets::encoded()]
}

/// A loopback port nobody listens on.
fn closed_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

/// Checks an error's `Display` and `Debug`.
#[track_caller]
fn hidden_in_error(what: &str, err: &LockError) {
    assert_hidden(&format!("{what}: the error"), &err.to_string());
    assert_hidden(&format!("{what}: the error's Debug"), &format!("{err:?}"));
}

/// Parses `url` and connects with it (short timeouts), checking the
/// config's `Debug`, the error, or the backend's `Debug`; the backend, if
/// one connected, is closed.
async fn drive(what: &str, url: &str) -> Result<(), LockError> {
    match PostgresConfig::from_url(url) {
        Ok(config) => {
            assert_hidden(
                &format!("{what}: the config's Debug"),
                &format!("{config:?}"),
            );
            let config = config
                .connect_timeout(Duration::from_secs(2))
                .op_timeout(Duration::from_secs(2));
            let connected = PostgresBackend::connect_with(config).await;
            settle(what, connected).await
        }
        Err(err) => {
            hidden_in_error(&format!("{what} (from_url)"), &err);
            let err = PostgresBackend::connect(url)
                .await
                .expect_err("from_url refused it");
            hidden_in_error(&format!("{what} (connect)"), &err);
            Err(err)
        }
    }
}

/// Checks what a connect gave, and closes a backend it connected.
async fn settle(
    what: &str,
    connected: Result<PostgresBackend, LockError>,
) -> Result<(), LockError> {
    match connected {
        Ok(backend) => {
            assert_hidden(
                &format!("{what}: the backend's Debug"),
                &format!("{backend:?}"),
            );
            backend.close().await
        }
        Err(err) => {
            hidden_in_error(what, &err);
            Err(err)
        }
    }
}

#[tokio::test]
async fn a_closed_port_never_shows_the_password() {
    capture_tracing();
    let port = closed_port();
    for pw in passwords() {
        for url in [
            format!("postgres://locker:{pw}@127.0.0.1:{port}/db"),
            format!("postgresql://locker:{pw}@127.0.0.1:{port}/db?sslmode=disable&pool_size=2"),
            format!("postgres://locker@127.0.0.1:{port}/db?password={pw}"),
            format!("postgres://locker@127.0.0.1:{port}/db?password={pw}&application_name=x"),
        ] {
            let outcome = drive("a closed port", &url).await;
            assert!(outcome.is_err(), "nothing listens on {port}");
        }
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(port)
            .username("locker")
            .password(&pw)
            .database("db");
        let config = PostgresConfig::from_options(options).connect_timeout(Duration::from_secs(2));
        assert_hidden("the builder's config Debug", &format!("{config:?}"));
        let outcome = settle(
            "the builder path",
            PostgresBackend::connect_with(config).await,
        )
        .await;
        assert!(outcome.is_err());
    }
    assert_hidden("tracing", &captured());
}

#[tokio::test]
async fn malformed_urls_never_show_the_password() {
    capture_tracing();
    let port = closed_port();
    for pw in passwords() {
        for url in [
            format!("postgres:/locker:{pw}@127.0.0.1:{port}/db"),
            format!("postgres:locker:{pw}@127.0.0.1:{port}/db"),
            format!("postgres//locker:{pw}@127.0.0.1:{port}/db"),
            format!(" postgres://locker:{pw}@127.0.0.1:{port}/db"),
            format!("mysql://locker:{pw}@127.0.0.1:{port}/db"),
            format!("postgres://locker:{pw}@[::1/db"),
            format!("postgres://locker:{pw}@127.0.0.1:{port}/db?sslmode=bogus"),
            format!("postgres://locker:{pw}@127.0.0.1:{port}/db?pool_size=x"),
            format!("postgres://locker@127.0.0.1:{port}/db?password={pw}&pool_size=x"),
            format!("postgres://locker@127.0.0.1:{port}/db?password={pw}&port=x"),
            format!("host=127.0.0.1 port={port} user=locker password={pw} dbname=db"),
            format!("password={pw}"),
        ] {
            let _ = drive("a malformed URL", &url).await;
        }
        // Unknown options are refused, never shown with their values (nor
        // named after a password); libpq's parameters sqlx does not read
        // are dropped with a warning naming them, and an old spelling is
        // read with a warning: neither shows the password.
        for url in [
            format!("postgres://locker@127.0.0.1:{port}/db?pwd={pw}"),
            format!("postgres://locker@127.0.0.1:{port}/db?password={pw}&{pw}=1"),
            format!("postgres://locker@127.0.0.1:{port}/db?password=a&b{pw}"),
            format!("postgres://locker:{pw}@127.0.0.1:{port}/db?keepalives={pw}"),
            format!("postgres://locker:{pw}@127.0.0.1:{port}/db?lock_pool_size=2"),
        ] {
            let _ = drive("an unknown parameter", &url).await;
        }
    }
    let logged = captured();
    for warning in [
        "ignoring a libpq parameter sqlx does not read",
        "URL option lock_pool_size is renamed pool_size",
    ] {
        assert!(logged.contains(warning), "the capture works: {logged}");
    }
    assert_hidden("tracing", &logged);
}

/// A server that asks for passwords: the marker is the wrong password of
/// one role and the right one of another; the right one connects (and a
/// backend works), and a password changed under a connected backend makes
/// its new connections (listener, turnstiles, pool) fail, logged.
#[tokio::test]
async fn passwords_a_server_checks_never_show() {
    capture_tracing();
    let store = postgres::start(Options::default().password_auth(true)).expect("private postgres");
    // The test's own statements hold the marker: sqlx must not log them.
    let admin_options: PgConnectOptions = store.url().parse().unwrap();
    let mut admin = PgConnection::connect_with(&admin_options.disable_statement_logging())
        .await
        .unwrap();
    for statement in [
        format!("CREATE ROLE locker LOGIN PASSWORD '{MARKER}'"),
        "CREATE ROLE other LOGIN PASSWORD 'not-the-marker'".to_owned(),
        "CREATE DATABASE locks OWNER locker".to_owned(),
    ] {
        sqlx::query(&statement).execute(&mut admin).await.unwrap();
    }
    let addr = store.addr();
    let encoded = secrets::encoded();

    let wrong = drive(
        "a wrong password",
        &format!("postgres://other:{encoded}@{addr}/locks"),
    )
    .await
    .expect_err("the wrong password");
    assert!(
        wrong.to_string().contains("password authentication failed"),
        "{wrong}"
    );
    drive(
        "a raw right password",
        &format!("postgres://locker:{MARKER}@{addr}/locks"),
    )
    .await
    .expect_err("unescaped: refused");
    drive(
        "the right password",
        &format!("postgres://locker:{encoded}@{addr}/locks"),
    )
    .await
    .expect("the right password connects");
    drive(
        "the right password as a parameter",
        &format!("postgres://locker@{addr}/locks?password={encoded}"),
    )
    .await
    .expect("the right password connects");

    let options = PgConnectOptions::new()
        .host(&addr.ip().to_string())
        .port(addr.port())
        .username("locker")
        .password(MARKER)
        .database("locks");
    let client = PostgresBackend::connect_with(PostgresConfig::from_options(options.clone()))
        .await
        .expect("the builder path connects");
    let pool = sqlx::PgPool::connect_with(options).await.unwrap();
    let pooled = PostgresBackend::from_pool(pool)
        .await
        .expect("a caller's pool");
    assert_hidden("the pooled backend's Debug", &format!("{pooled:?}"));
    // The password changes: every new connection of `client` is refused.
    sqlx::query("ALTER ROLE locker PASSWORD 'changed'")
        .execute(&mut admin)
        .await
        .unwrap();
    // Held by a client of the launcher's trusted role, which still connects.
    let holder = PostgresBackend::connect(&format!("postgres://postgres@{addr}/locks"))
        .await
        .unwrap();
    let name = lock_name("held");
    let held = holder
        .try_acquire_for(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    let waited = Locker::new(client.clone())
        .acquire_timeout(&name, Duration::from_millis(500))
        .await;
    match waited {
        Err(err) => hidden_in_error("a waiter whose connections are refused", &err),
        Ok(_) => panic!("the name is held"),
    }
    assert_hidden("the backend's Debug", &format!("{client:?}"));
    holder.release(&held).await.unwrap();
    holder.close().await.unwrap();
    client.close().await.unwrap();
    pooled.close().await.unwrap();
    assert_hidden("tracing", &captured());
}
