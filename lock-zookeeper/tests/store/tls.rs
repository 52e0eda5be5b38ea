//! `zks://` end to end: a private ZooKeeper that serves clients over TLS
//! only (its secure client port, Netty), with a CA and certificates made
//! here (rcgen). Trusting the CA locks, from the URL and from the builder;
//! another CA, or a certificate not issued for the host dialled, is refused
//! at connect, saying which; `ssl.clientAuth=need` wants a client
//! certificate from its CA; digest credentials travel inside TLS; bad PEM is
//! a config error.

#![cfg(feature = "tls")]

use std::path::PathBuf;

use lock_conformance::kit::pki::{Identity, TestCa, assert_refused_for};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::zookeeper::{self as launcher, ClientTls, Options};
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockError, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::{session_timeout, unique};

/// A CA, and a private ZooKeeper serving clients over TLS only with a
/// certificate signed by it, and the CA's PEM file for `tls_ca`.
struct Tls {
    ca: TestCa,
    store: Store,
    files: tempfile::TempDir,
}

impl Tls {
    /// A server whose certificate names 127.0.0.1 and localhost.
    async fn start(client_cert_auth: bool) -> Tls {
        let ca = TestCa::new("distlock zookeeper test CA");
        let server = ca.server();
        let mut tls = ClientTls::new(ca.pem(), server.cert, server.key);
        if client_cert_auth {
            tls = tls.client_cert_auth();
        }
        Tls::start_with(ca, tls).await
    }

    async fn start_with(ca: TestCa, tls: ClientTls) -> Tls {
        let store = tokio::task::spawn_blocking(|| launcher::start(Options::default().tls(tls)))
            .await
            .expect("launcher thread")
            .expect("a private ZooKeeper serving TLS (apt-get install zookeeper)");
        assert!(store.url().starts_with("zks://"), "{}", store.url());
        let files = tempfile::tempdir().unwrap();
        ca.write(files.path(), "ca.pem").unwrap();
        Tls { ca, store, files }
    }

    fn ca_file(&self) -> PathBuf {
        self.files.path().join("ca.pem")
    }

    /// `zks://[userinfo@]127.0.0.1:P?tls_ca=...` plus `extra` options.
    fn url(&self, userinfo: &str, extra: &str) -> String {
        format!(
            "zks://{userinfo}{}?tls_ca={}{extra}",
            self.store.addr(),
            self.ca_file().display()
        )
    }

    /// A client certificate signed by the CA, written as PEM files.
    fn client_identity(&self) -> (PathBuf, PathBuf) {
        self.ca.client().write(self.files.path(), "client").unwrap()
    }
}

/// The configuration of a test client: the tests' session timeout, and
/// connecting bounded by it too (a refusal comes well before).
fn config(url: &str) -> ZooKeeperConfig {
    crate::support::config(url).connect_timeout(session_timeout())
}

/// Connects, failing the test if the attempt does not end (succeed or
/// fail) within twice the connect timeout: a hang, not a slow refusal.
async fn connect(config: ZooKeeperConfig) -> Result<ZooKeeperBackend, LockError> {
    tokio::time::timeout(
        2 * session_timeout(),
        ZooKeeperBackend::connect_with(config),
    )
    .await
    .expect("connecting must end in bounded time, not hang")
}

/// A refusal that is final: typed, not retryable, before the connect
/// timeout ran out, and saying why (`why`, and what to check: `check`).
#[track_caller]
fn assert_refused(
    what: &str,
    result: Result<ZooKeeperBackend, LockError>,
    started: Instant,
    why: &str,
    check: &str,
) {
    let err = match result {
        Ok(backend) => panic!("{what}: the connection should have been refused: {backend:?}"),
        Err(e) => e,
    };
    assert!(
        started.elapsed() < session_timeout(),
        "{what}: took {:?}, the whole connect timeout: {err}",
        started.elapsed()
    );
    let said = err.to_string();
    eprintln!("{what}: refused after {:?}: {said}", started.elapsed());
    assert_refused_for(&err, why);
    assert!(said.contains(check), "{what}: {said}");
}

/// Acquire, renew, release, and again over the connection under test: the
/// second fence is larger.
async fn lock_cycle(backend: &ZooKeeperBackend, what: &str) {
    let name = unique(what);
    let mut fences = Vec::new();
    for _ in 0..2 {
        let ttl = session_timeout();
        let lease = match backend.try_acquire_for(&name, ttl).await.unwrap() {
            Attempt::Acquired(lease) => lease,
            held => panic!("{name} should be free: {held:?}"),
        };
        let holder = backend.inspect(&name).await.unwrap().expect("held");
        assert_eq!(holder.fence, lease.fence());
        let renewed = backend.renew(&lease).await.unwrap();
        assert_eq!(renewed.fence(), lease.fence());
        assert_eq!(
            backend.release(&renewed).await.unwrap(),
            ReleaseOutcome::Released
        );
        fences.push(lease.fence());
    }
    assert!(fences[1] > fences[0], "fences must increase: {fences:?}");
}

/// The server has no plaintext port, so every lock cycle here ran over
/// TLS; the same port spoken to in plaintext gives no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_ca_locks_over_tls_from_the_url_and_the_builder() {
    let tls = Tls::start(false).await;

    let from_url = connect(config(&tls.url("", ""))).await.unwrap();
    assert!(from_url.config().uses_tls());
    lock_cycle(&from_url, "tls-url").await;

    let pem = std::fs::read(tls.ca_file()).unwrap();
    let built = crate::support::config(tls.store.endpoint())
        .tls_root_cert_pem(pem)
        .unwrap();
    lock_cycle(&connect(built).await.unwrap(), "tls-builder").await;

    // `localhost` is in the certificate too.
    let by_name = format!(
        "zks://localhost:{}?tls_ca={}",
        tls.store.addr().port(),
        tls.ca_file().display()
    );
    lock_cycle(&connect(config(&by_name)).await.unwrap(), "tls-name").await;

    let plain = format!("zk://{}", tls.store.addr());
    let err = connect(config(&plain)).await.unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. }),
        "plaintext to a TLS port: {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused() {
    let tls = Tls::start(false).await;
    let other = TestCa::new("another CA");
    let files = tempfile::tempdir().unwrap();
    let other_file = other.write(files.path(), "other-ca.pem").unwrap();

    let url = format!("zks://{}?tls_ca={}", tls.store.addr(), other_file.display());
    let started = Instant::now();
    assert_refused(
        "another CA, from the URL",
        connect(config(&url)).await,
        started,
        "UnknownIssuer",
        "tls_ca",
    );
    let started = Instant::now();
    let built = crate::support::config(tls.store.endpoint())
        .tls_root_cert_pem(other.pem())
        .unwrap();
    assert_refused(
        "another CA, from the builder",
        connect(built).await,
        started,
        "UnknownIssuer",
        "tls_ca",
    );
}

/// A certificate from the trusted CA, but for another host than the one
/// dialled (the server's name is checked, not only its CA).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused() {
    let ca = TestCa::new("distlock zookeeper test CA");
    let Identity { cert, key } = ca.server_for(&["elsewhere.example"]);
    let server = ClientTls::new(ca.pem(), cert, key).issued_for("elsewhere.example");
    let tls = Tls::start_with(ca, server).await;

    let started = Instant::now();
    assert_refused(
        "a certificate for elsewhere.example, dialled as 127.0.0.1",
        connect(config(&tls.url("", ""))).await,
        started,
        "not valid for name",
        "issued for the host",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_with_client_auth_need() {
    let tls = Tls::start(true).await;

    let started = Instant::now();
    assert_refused(
        "no client certificate",
        connect(config(&tls.url("", ""))).await,
        started,
        "refused the TLS handshake",
        "tls_cert",
    );

    // A certificate from another CA is no better.
    let stranger = TestCa::new("a stranger's CA").client();
    let (cert, key) = stranger.write(tls.files.path(), "stranger").unwrap();
    let foreign = tls.url(
        "",
        &format!("&tls_cert={}&tls_key={}", cert.display(), key.display()),
    );
    let started = Instant::now();
    assert_refused(
        "a foreign client certificate",
        connect(config(&foreign)).await,
        started,
        "refused the TLS handshake",
        "tls_cert",
    );

    let (cert, key) = tls.client_identity();
    let url = tls.url(
        "",
        &format!("&tls_cert={}&tls_key={}", cert.display(), key.display()),
    );
    let identified = config(&url);
    let shown = format!("{identified:?}");
    let key_body = std::fs::read_to_string(&key).unwrap();
    let key_body = key_body.lines().nth(1).unwrap();
    assert!(!shown.contains(key_body), "{shown}");
    let backend = connect(identified).await.unwrap();
    lock_cycle(&backend, "mtls").await;

    // The builder's way to the same.
    let Identity { cert, key } = tls.ca.client();
    let built = crate::support::config(tls.store.endpoint())
        .tls_root_cert_pem(tls.ca.pem())
        .unwrap()
        .tls_client_identity_pem(cert, key)
        .unwrap();
    lock_cycle(&connect(built).await.unwrap(), "mtls-builder").await;
}

/// Digest credentials inside TLS: lock nodes belong to that identity, and
/// another identity is refused at connect, naming the credentials, never
/// showing a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_over_tls() {
    let tls = Tls::start(false).await;
    let password = "s3cret-over-tls";
    let root = format!("/zk-tls-acl-{}", uuid::Uuid::new_v4().simple());
    let alice = config(&tls.url(&format!("alice:{password}@"), "")).root(&root);
    let backend = connect(alice.clone()).await.unwrap();
    lock_cycle(&backend, "tls-digest").await;
    let (lease, acl) = crate::support::held_node_acl(&backend, &unique("tls-digest-acl")).await;
    assert!(
        acl.iter()
            .all(|a| a.scheme() == "digest" && a.id().starts_with("alice:")),
        "{acl:?}"
    );
    for shown in [format!("{alice:?}"), format!("{backend:?}")] {
        assert!(!shown.contains(password), "password shown: {shown}");
    }

    // The server closes the connection right after its auth-failure
    // notice: now and then the close is all the client sees (a retryable
    // error that names no cause). The refusal must come, said clearly,
    // within a few tries.
    let mallory = config(&tls.url("mallory:guess@", "")).root(&root);
    let mut tries = 0;
    let err = loop {
        tries += 1;
        let started = Instant::now();
        let err = connect(mallory.clone()).await.unwrap_err();
        assert!(
            started.elapsed() < session_timeout(),
            "{:?}",
            started.elapsed()
        );
        if !err.is_retryable() || tries == 3 {
            break err;
        }
    };
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    let said = err.to_string();
    assert!(said.contains("check the digest credentials"), "{said}");
    assert!(
        !said.contains("guess") && !said.contains(password),
        "{said}"
    );
    backend.release(&lease).await.unwrap();
}

#[test]
fn bad_tls_settings_are_config_errors() {
    let ca = TestCa::new("distlock test CA");
    let client = ca.client();
    let other = ca.client();
    let base = || ZooKeeperConfig::new("127.0.0.1:2281");
    #[track_caller]
    fn is_config(result: Result<ZooKeeperConfig, LockError>, what: &str) -> String {
        match result {
            Err(e @ LockError::InvalidConfig { .. }) => e.to_string(),
            other => panic!("{what}: {other:?}"),
        }
    }

    let truncated = &ca.pem()[..ca.pem().len() / 2];
    let not_der = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    for (pem, what) in [
        ("", "empty"),
        ("not a certificate", "no PEM block"),
        (truncated, "truncated"),
        (not_der, "not a certificate inside"),
        (client.key.as_str(), "a key where a certificate belongs"),
    ] {
        is_config(base().tls_root_cert_pem(pem), what);
    }
    let trusted = || base().tls_root_cert_pem(ca.pem()).unwrap();
    is_config(
        trusted().tls_client_identity_pem("", &client.key),
        "no client certificate",
    );
    is_config(
        trusted().tls_client_identity_pem(&client.cert, "not a key"),
        "no client key",
    );
    let said = is_config(
        trusted().tls_client_identity_pem(&client.cert, &other.key),
        "another certificate's key",
    );
    assert!(!said.contains(other.key.lines().nth(1).unwrap()), "{said}");
    assert!(said.contains("does not fit"), "{said}");
    is_config(
        base().tls_client_identity_pem(&client.cert, &client.key),
        "a client certificate before a CA",
    );

    // The URL: zks:// needs tls_ca; TLS options need zks://; the pair goes together.
    let files = tempfile::tempdir().unwrap();
    let ca_file = ca.write(files.path(), "ca.pem").unwrap();
    let (cert, key) = client.write(files.path(), "client").unwrap();
    let from_url = |url: String| ZooKeeperConfig::from_url(&url);
    let said = is_config(
        from_url("zks://127.0.0.1:2281".into()),
        "zks:// without tls_ca",
    );
    assert!(said.contains("tls_ca"), "{said}");
    let said = is_config(
        from_url(format!("zk://127.0.0.1:2181?tls_ca={}", ca_file.display())),
        "tls_ca on zk://",
    );
    assert!(said.contains("zks://"), "{said}");
    let said = is_config(
        from_url(format!(
            "zks://127.0.0.1:2281?tls_ca={}&tls_cert={}",
            ca_file.display(),
            cert.display()
        )),
        "tls_cert without tls_key",
    );
    assert!(said.contains("go together"), "{said}");
    let said = is_config(
        from_url("zks://127.0.0.1:2281?tls_ca=/nonexistent/ca.pem".into()),
        "a missing file",
    );
    assert!(
        said.contains("cannot read tls_ca /nonexistent/ca.pem"),
        "{said}"
    );
    let good = from_url(format!(
        "zks://127.0.0.1:2281?tls_ca={}&tls_cert={}&tls_key={}",
        ca_file.display(),
        cert.display(),
        key.display()
    ))
    .unwrap();
    assert!(good.uses_tls());
    assert!(!format!("{good:?}").contains(client.key.lines().nth(1).unwrap()));
    assert!(!base().uses_tls());
}
