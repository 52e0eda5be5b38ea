//! `rediss://` end to end: a private `redis-server` that serves TLS only,
//! with a CA and certificates made here (rcgen). Trusting the CA works,
//! plaintext and the system roots alone are refused, client certificates are
//! presented when the server asks, and bad PEM is a config error.

#![cfg(feature = "tls")]

use std::time::Duration;

use lock_conformance::kit::pki::{Identity, TestCa, assert_refused_for, error_chain as chain};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::redis::{self as launcher, Options, Tls};
use lock_redis::{RedisBackend, RedisConfig};

use crate::support::scaled;
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockError, LockName, ReleaseOutcome};
/// The connect and response timeout of every client here: no test asserts
/// a bound on them (a refusal is prompt whatever the timeout), so they
/// are generous, lest a loaded machine turn a slow reply into a failure.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Far above any bounded failure: hitting it means a hang.
const HANG: Duration = Duration::from_secs(15);

fn ca() -> TestCa {
    TestCa::new("distlock test CA")
}

/// A TLS-only server with a certificate from `ca` (for 127.0.0.1 and
/// localhost).
async fn tls_server(ca: &TestCa, client_certs: bool) -> Store {
    tls_server_with(ca, ca.server(), client_certs).await
}

/// A TLS-only server presenting `server`, a certificate from `ca`.
async fn tls_server_with(ca: &TestCa, server: Identity, client_certs: bool) -> Store {
    let tls = Tls::new(server.cert, server.key, ca.pem()).require_client_certs(client_certs);
    tokio::task::spawn_blocking(move || launcher::start(Options::default().tls(tls)))
        .await
        .expect("launcher thread")
        .expect("redis-server with TLS support must be installed (apt-get install redis-server)")
}

fn config(url: &str) -> RedisConfig {
    RedisConfig::from_url(url)
        .unwrap()
        .connect_timeout(scaled(TIMEOUT))
        .response_timeout(scaled(TIMEOUT))
}

/// Connects, failing the test if the attempt does not end in bounded time.
async fn connect(config: RedisConfig) -> Result<RedisBackend, LockError> {
    tokio::time::timeout(HANG, RedisBackend::connect_with(config))
        .await
        .expect("connecting must end (succeed or fail) in bounded time, not hang")
}

fn connect_err(result: Result<RedisBackend, LockError>) -> LockError {
    match result {
        Ok(backend) => panic!("the connection should have been refused: {backend:?}"),
        Err(e) => e,
    }
}

/// Acquire, renew, release, acquire again: every step over the connection
/// under test, fences strictly increasing across grants.
async fn lock_cycle(backend: &RedisBackend) {
    let name = LockName::new(format!(
        "tls/{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ))
    .unwrap();
    let ttl = Duration::from_secs(10);
    let Attempt::Acquired(first) = backend.try_acquire_for(&name, ttl).await.unwrap() else {
        panic!("{name} is fresh, so free");
    };
    let renewed = backend.renew(&first).await.unwrap();
    assert_eq!(
        renewed.fence(),
        first.fence(),
        "renew keeps the grant's fence"
    );
    assert!(matches!(
        backend.try_acquire_for(&name, ttl).await.unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(
        backend.release(&renewed).await.unwrap(),
        ReleaseOutcome::Released
    );
    let Attempt::Acquired(second) = backend.try_acquire_for(&name, ttl).await.unwrap() else {
        panic!("{name} was released, so free");
    };
    assert!(
        second.fence() > first.fence(),
        "{:?} after {:?}",
        second.fence(),
        first.fence()
    );
    assert_eq!(
        backend.release(&second).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn a_trusted_ca_locks_over_tls_and_plaintext_is_refused() {
    let ca = ca();
    let store = tls_server(&ca, false).await;
    assert!(store.url().starts_with("rediss://"), "{}", store.url());

    let trusted = config(&store.url()).tls_root_cert_pem(ca.pem()).unwrap();
    let backend = connect(trusted).await.expect("TLS with the test CA");
    lock_cycle(&backend).await;

    // The server has no plaintext port: the same port spoken to in plaintext.
    let plain = config(&format!("redis://{}", store.addr()));
    let err = connect_err(connect(plain).await);
    assert!(err.is_retryable(), "{err:?}");

    // A restarted TLS-only store serves TLS again, on the same port.
    drop(backend);
    store.restart_now().expect("restart");
    let again = config(&store.url()).tls_root_cert_pem(ca.pem()).unwrap();
    let backend = connect(again).await.expect("TLS after a restart");
    lock_cycle(&backend).await;
}

#[tokio::test]
async fn a_server_certificate_from_an_untrusted_ca_is_refused() {
    let ca = ca();
    let store = tls_server(&ca, false).await;

    // System roots only: the test CA is not among them.
    let err = connect_err(connect(config(&store.url())).await);
    assert!(
        matches!(err, LockError::Store { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(chain(&err).contains("UnknownIssuer"), "{}", chain(&err));

    // Another private CA is no better.
    let other = config(&store.url())
        .tls_root_cert_pem(self::ca().pem())
        .unwrap();
    let err = connect_err(connect(other).await);
    assert!(
        matches!(err, LockError::Store { .. }) && !err.is_retryable(),
        "{err:?}"
    );
}

/// A certificate from the trusted CA, but for another host than the one
/// dialled: the host name is checked, not only the issuer.
#[tokio::test]
async fn a_server_certificate_for_another_host_is_refused() {
    let ca = ca();
    let store = tls_server_with(&ca, ca.server_for(&["elsewhere.example"]), false).await;
    let trusted = config(&store.url()).tls_root_cert_pem(ca.pem()).unwrap();
    let err = connect_err(connect(trusted).await);
    assert_refused_for(&err, "not valid for name");
}

#[tokio::test]
async fn client_certificates_are_presented_when_the_server_asks() {
    let ca = ca();
    let store = tls_server(&ca, true).await;
    let trusted = || config(&store.url()).tls_root_cert_pem(ca.pem()).unwrap();

    // The server refuses the handshake: an alert, not worth retrying.
    let err = connect_err(connect(trusted()).await);
    assert!(
        matches!(err, LockError::Store { .. }) && chain(&err).contains("CertificateRequired"),
        "{}",
        chain(&err)
    );

    let stranger = self::ca().client();
    let err = connect_err(
        connect(
            trusted()
                .tls_client_identity_pem(&stranger.cert, &stranger.key)
                .unwrap(),
        )
        .await,
    );
    assert!(
        matches!(err, LockError::Store { .. }) && !err.is_retryable(),
        "{err:?}"
    );

    let client = ca.client();
    let identified = trusted()
        .tls_client_identity_pem(&client.cert, &client.key)
        .unwrap();
    let shown = format!("{identified:?}");
    let key_body = client.key.lines().nth(1).unwrap();
    assert!(
        !shown.contains(key_body) && shown.contains("<redacted>"),
        "{shown}"
    );
    let backend = connect(identified)
        .await
        .expect("TLS with a client certificate");
    lock_cycle(&backend).await;
}

/// The same certificates named in the URL (`tls_ca`, `tls_cert`,
/// `tls_key`): without the client pair the server refuses the handshake,
/// with it the lock cycle runs.
#[tokio::test]
async fn the_url_names_the_pem_files() {
    let ca = ca();
    let store = tls_server(&ca, true).await;
    let client = ca.client();
    let dir = std::env::temp_dir().join(format!(
        "lock-redis-tls-url-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let (ca_file, cert, key) = (
        file("ca.pem", &ca.pem()),
        file("client.pem", &client.cert),
        file("client.key", &client.key),
    );
    let short = format!(
        "timeout={0}ms&connect_timeout={0}ms",
        scaled(TIMEOUT).as_millis()
    );
    let err = connect_err(
        connect(
            RedisConfig::from_url(&format!("{}?tls_ca={ca_file}&{short}", store.url())).unwrap(),
        )
        .await,
    );
    assert!(
        chain(&err).contains("CertificateRequired"),
        "{}",
        chain(&err)
    );
    let url = format!(
        "{}?tls_ca={ca_file}&tls_cert={cert}&tls_key={key}&{short}",
        store.url()
    );
    let backend = connect(RedisConfig::from_url(&url).unwrap())
        .await
        .expect("TLS with the files the URL names");
    lock_cycle(&backend).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_pem_is_a_config_error() {
    let ca = ca();
    let client = ca.client();
    let other = ca.client();
    let base = || RedisConfig::from_url("rediss://127.0.0.1:6380").unwrap();
    let is_config = |result: Result<RedisConfig, LockError>, what: &str| match result {
        Err(LockError::InvalidConfig { .. }) => {}
        other => panic!("{what}: {other:?}"),
    };

    let truncated = &ca.pem()[..ca.pem().len() / 2];
    let bad_base64 = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
    let not_der = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    for (pem, what) in [
        ("", "empty"),
        ("not a certificate", "no PEM block"),
        (truncated, "truncated"),
        (bad_base64, "bad base64"),
        (not_der, "not a certificate inside"),
        (client.key.as_str(), "a key where a certificate belongs"),
    ] {
        is_config(base().tls_root_cert_pem(pem), what);
    }

    is_config(
        base().tls_client_identity_pem("", &client.key),
        "no client certificate",
    );
    is_config(
        base().tls_client_identity_pem(&client.cert, "not a key"),
        "no client key",
    );
    let err = base()
        .tls_client_identity_pem(&client.cert, &other.key)
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    let key_body = other.key.lines().nth(1).unwrap();
    assert!(!chain(&err).contains(key_body), "{err}");

    // Certificates only make sense with TLS.
    is_config(
        RedisConfig::from_url("redis://127.0.0.1:6379")
            .unwrap()
            .tls_root_cert_pem(ca.pem()),
        "plain redis://",
    );
}
