//! T4.12: TLS from the URL's `sslmode`/`sslrootcert`, against a private
//! PostgreSQL switched to `ssl = on` with certificates made here (rcgen).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use crate::support::with_params;
use lock_conformance::kit::pki::{TestCa, assert_refused_for, error_chain as chain};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockError, LockName};
/// Writes `contents` to `path` with `mode`, owned like `owner_of` (the data
/// dir, which belongs to the user the server runs as).
fn write_as_server(path: &Path, contents: &str, mode: u32, owner_of: &Path) {
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    let meta = std::fs::metadata(owner_of).unwrap();
    std::os::unix::fs::chown(path, Some(meta.uid()), Some(meta.gid())).unwrap();
}

async fn reload(url: &str) {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut conn)
        .await
        .unwrap();
}

async fn lock_cycle(backend: &PostgresBackend) {
    let name = LockName::new(format!("tls/{}", uuid::Uuid::new_v4())).unwrap();
    match backend
        .try_acquire_for(&name, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Attempt::Acquired(lease) => {
            backend.release(&lease).await.unwrap();
        }
        held => panic!("fresh name held: {held:?}"),
    }
}

#[tokio::test]
async fn tls_modes_come_from_the_url() {
    let store = postgres::start(Options::default()).expect("private postgres");
    let data = store.data_dir().unwrap().join("data");
    let ca = TestCa::new("distlock test CA");
    let server = ca.server();
    write_as_server(&data.join("server.crt"), &server.cert, 0o644, &data);
    write_as_server(&data.join("server.key"), &server.key, 0o600, &data);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let wrong_ca_file = dir.path().join("wrong-ca.pem");
    std::fs::write(&wrong_ca_file, TestCa::new("another CA").pem()).unwrap();

    // TLS on, and only TLS accepted over TCP.
    let mut conn = PgConnection::connect(&store.url()).await.unwrap();
    sqlx::query("ALTER SYSTEM SET ssl = 'on'")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);
    write_as_server(
        &data.join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        0o600,
        &data,
    );
    // Still plaintext: the reload is what turns TLS on.
    reload(&store.url()).await;

    let verified = with_params(
        &store.url(),
        &format!("sslmode=verify-full&sslrootcert={}", ca_file.display()),
    );
    // The reload is asynchronous: wait until TLS is served.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    let backend = loop {
        match PostgresBackend::connect(&verified).await {
            Ok(backend) => break backend,
            Err(e) => {
                assert!(tokio::time::Instant::now() < give_up, "no TLS: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    lock_cycle(&backend).await;
    let mut observer = PgConnection::connect(&verified).await.unwrap();
    let (sessions, encrypted): (i64, bool) = sqlx::query_as(
        "SELECT count(*), coalesce(bool_and(s.ssl), false)
           FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
          WHERE a.application_name = 'distlock'",
    )
    .fetch_one(&mut observer)
    .await
    .unwrap();
    assert!(sessions >= 1, "the backend's statement connection");
    assert!(encrypted, "statements must run over TLS");

    // A server certificate from another CA is refused, and not retried.
    let wrong = with_params(
        &store.url(),
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            wrong_ca_file.display()
        ),
    );
    let err = PostgresBackend::connect(&wrong).await.unwrap_err();
    assert_refused_for(&err, "UnknownIssuer");

    // Plaintext is refused where the server requires TLS.
    let plain = with_params(&store.url(), "sslmode=disable");
    let err = PostgresBackend::connect(&plain).await.unwrap_err();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");

    password_over_tls(&store, &data, &ca_file).await;
    another_host_is_refused(&store, &data, &ca, &ca_file).await;
}

/// A role with a password (SCRAM over TLS) and only the grants
/// docs/operations.md lists for `create_schema=false`: it locks; a wrong
/// password is refused, final, and never shown.
async fn password_over_tls(store: &Store, data: &Path, ca_file: &Path) {
    let password = "s3cret-over-tls";
    let mut conn = PgConnection::connect(&store.url()).await.unwrap();
    for statement in [
        format!("CREATE ROLE locker LOGIN PASSWORD '{password}'"),
        "GRANT USAGE ON SCHEMA public TO locker".to_owned(),
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.distlock_locks, \
         public.distlock_locks_permits, public.distlock_locks_epoch TO locker"
            .to_owned(),
        "GRANT USAGE, UPDATE ON SEQUENCE public.distlock_locks_fence_seq TO locker".to_owned(),
    ] {
        sqlx::query(&statement).execute(&mut conn).await.unwrap();
    }
    drop(conn);
    write_as_server(
        &data.join("pg_hba.conf"),
        "local all all trust\nhostssl all locker 127.0.0.1/32 scram-sha-256\n\
         hostssl all all 127.0.0.1/32 trust\n",
        0o600,
        data,
    );
    reload(&store.url()).await;
    let url = |password: &str| {
        let addr = store.addr();
        format!(
            "postgres://locker:{password}@{addr}/postgres?sslmode=verify-full&sslrootcert={}&create_schema=false",
            ca_file.display()
        )
    };
    // The reload is asynchronous: wait until a wrong password is refused.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    let err = loop {
        match PostgresBackend::connect(&url("not-the-password")).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    tokio::time::Instant::now() < give_up,
                    "no password required"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let said = chain(&err);
    assert!(
        matches!(err, LockError::Store { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(said.contains("password authentication failed"), "{said}");
    assert!(
        !said.contains("not-the-password") && !said.contains(password),
        "{said}"
    );
    let backend = PostgresBackend::connect(&url(password)).await.unwrap();
    assert!(!format!("{backend:?}").contains(password));
    lock_cycle(&backend).await;
}

/// A certificate from the trusted CA for another host than the one
/// dialled: `verify-full` refuses it, naming the host name.
async fn another_host_is_refused(store: &Store, data: &Path, ca: &TestCa, ca_file: &Path) {
    let elsewhere = ca.server_for(&["elsewhere.example"]);
    write_as_server(&data.join("server.crt"), &elsewhere.cert, 0o644, data);
    write_as_server(&data.join("server.key"), &elsewhere.key, 0o600, data);
    reload(&store.url()).await;
    let verified = with_params(
        &store.url(),
        &format!("sslmode=verify-full&sslrootcert={}", ca_file.display()),
    );
    // The reload is asynchronous: wait until the new certificate is served.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    let err = loop {
        match PostgresBackend::connect(&verified).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    tokio::time::Instant::now() < give_up,
                    "the old certificate stays"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_refused_for(&err, "not valid for name");
}
