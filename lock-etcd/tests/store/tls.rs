//! TLS and password authentication end to end, against private etcd members
//! serving clients over TLS with certificates made here (rcgen): the
//! `etcds://` URL and the builder, a client that does not trust the CA,
//! `--client-cert-auth`, and users and roles over TLS.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::name;
use lock_conformance::kit::pki::{Identity, TestCa};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::etcd::{self, ClientTls, Options};
use lock_etcd::etcd_client::{Certificate, Client, ConnectOptions, Permission, TlsOptions};
use lock_etcd::{EtcdBackend, EtcdConfig, TlsConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockError, LockName, ReleaseOutcome};
use tokio::time::Instant;

/// Long enough for any refusal here; a hang fails the test instead of
/// stalling it.
const BOUND: Duration = Duration::from_secs(15);

/// A CA, and a private etcd serving clients over TLS with a certificate for
/// 127.0.0.1 and localhost signed by it.
struct Tls {
    ca: TestCa,
    store: Store,
    files: tempfile::TempDir,
}

impl Tls {
    async fn start(client_cert_auth: bool) -> Tls {
        let ca = TestCa::new("distlock etcd test CA");
        let Identity { cert, key } = ca.server();
        let mut tls = ClientTls::new(ca.pem(), cert, key);
        if client_cert_auth {
            tls = tls.client_cert_auth();
        }
        let store = tokio::task::spawn_blocking(|| etcd::start(Options::default().tls(tls)))
            .await
            .unwrap()
            .expect("a private etcd serving TLS");
        assert!(
            store.endpoint().starts_with("https://"),
            "{}",
            store.endpoint()
        );
        let files = tempfile::tempdir().unwrap();
        ca.write(files.path(), "ca.pem").unwrap();
        Tls { ca, store, files }
    }

    fn ca_file(&self) -> PathBuf {
        self.files.path().join("ca.pem")
    }

    /// `etcds://[userinfo@]127.0.0.1:P[/prefix/]?tls_ca=...` plus `extra` options.
    fn url(&self, userinfo: &str, path: &str, extra: &str) -> String {
        format!(
            "etcds://{userinfo}{}{path}?tls_ca={}{extra}",
            self.store.addr(),
            self.ca_file().display()
        )
    }

    /// A client certificate signed by the CA, written as PEM files.
    fn client_identity(&self) -> (PathBuf, PathBuf) {
        self.ca.client().write(self.files.path(), "client").unwrap()
    }
}

/// Connects with `config`, giving up after [`BOUND`].
async fn connect(config: EtcdConfig) -> Result<EtcdBackend, LockError> {
    tokio::time::timeout(BOUND, EtcdBackend::connect_with(config))
        .await
        .expect("connect neither succeeded nor failed in time")
}

/// Acquire, inspect, renew, release, and again: the second fence is larger.
async fn lock_cycle(backend: &EtcdBackend, lock: &LockName) {
    let mut fences = Vec::new();
    for _ in 0..2 {
        let lease = match backend
            .try_acquire_for(lock, Duration::from_secs(5))
            .await
            .unwrap()
        {
            Attempt::Acquired(lease) => lease,
            held => panic!("{lock} should be free: {held:?}"),
        };
        let holder = backend.inspect(lock).await.unwrap().expect("held");
        assert_eq!(holder.fence, lease.fence());
        assert_eq!(holder.owner, Some(lease.owner()));
        let renewed = backend.renew(&lease).await.unwrap();
        assert_eq!(renewed.fence(), lease.fence());
        assert_eq!(
            backend.release(&renewed).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert!(backend.inspect(lock).await.unwrap().is_none());
        fences.push(lease.fence());
    }
    assert!(fences[1] > fences[0], "fences must increase: {fences:?}");
}

/// A refusal that is final: typed, not retryable, quick, and saying why.
#[track_caller]
fn assert_refused(what: &str, result: Result<EtcdBackend, LockError>, started: Instant, why: &str) {
    let err = result.expect_err(what);
    assert!(
        started.elapsed() < BOUND,
        "{what}: took {:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, LockError::Store { .. }) && !err.is_retryable(),
        "{what}: {err:?}"
    );
    assert!(err.to_string().contains(why), "{what}: {err}");
}

/// The server refuses our client certificate: quickly, as an error. Under
/// TLS 1.3 the client sees the server's alert (a final verdict) only if it
/// reads it before the connection drops; otherwise a closed connection or a
/// broken pipe, retryable like any transport failure.
async fn assert_server_refuses(what: &str, config: EtcdConfig) {
    let started = Instant::now();
    let err = connect(config).await.expect_err(what);
    assert!(
        started.elapsed() < BOUND,
        "{what}: took {:?}",
        started.elapsed()
    );
    match &err {
        LockError::Store { .. } => assert!(err.to_string().contains("TLS handshake failed")),
        LockError::Unavailable { .. } => {}
        _ => panic!("{what}: {err:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_from_the_url_and_the_builder() {
    let tls = Tls::start(false).await;

    let from_url = EtcdBackend::connect(&tls.url("", "", "")).await.unwrap();
    lock_cycle(&from_url, &name("url")).await;

    let ca_pem = std::fs::read(tls.ca_file()).unwrap();
    let config = EtcdConfig::new([tls.store.endpoint()]).tls(TlsConfig::new().ca_pem(ca_pem));
    lock_cycle(&connect(config).await.unwrap(), &name("builder")).await;

    // The name checked is `tls_domain=`, not the endpoint's host.
    let by_name = connect(EtcdConfig::from_url(&tls.url("", "", "&tls_domain=localhost")).unwrap());
    lock_cycle(&by_name.await.unwrap(), &name("domain")).await;
    let started = Instant::now();
    let wrong_name = EtcdConfig::from_url(&tls.url("", "", "&tls_domain=elsewhere.example"));
    assert_refused(
        "a name not in the certificate",
        connect(wrong_name.unwrap()).await,
        started,
        "not valid for name",
    );

    // The platform's roots do not include our CA; nor does another CA.
    let started = Instant::now();
    let system_roots = EtcdConfig::new([tls.store.endpoint()]).tls(TlsConfig::new());
    assert_refused(
        "system roots",
        connect(system_roots).await,
        started,
        "invalid peer certificate",
    );
    let started = Instant::now();
    let other_ca = EtcdConfig::new([tls.store.endpoint()])
        .tls(TlsConfig::new().ca_pem(TestCa::new("another CA").pem()));
    assert_refused(
        "another CA",
        connect(other_ca).await,
        started,
        "invalid peer certificate",
    );

    // Plaintext towards the TLS port: an error, in bounded time.
    let started = Instant::now();
    let plain = EtcdConfig::new([format!("http://{}", tls.store.addr())])
        .request_timeout(Duration::from_secs(2));
    let err = connect(plain).await.expect_err("plaintext to a TLS port");
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
    assert!(
        matches!(err, LockError::Store { .. } | LockError::Unavailable { .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_with_client_cert_auth() {
    let tls = Tls::start(true).await;

    let anonymous = EtcdConfig::from_url(&tls.url("", "", "")).unwrap();
    assert_server_refuses("no client certificate", anonymous).await;

    // A certificate from another CA is no better.
    let stranger = TestCa::new("a stranger's CA").client();
    let (cert, key) = stranger.write(tls.files.path(), "stranger").unwrap();
    let foreign = EtcdConfig::from_url(&tls.url(
        "",
        "",
        &format!("&tls_cert={}&tls_key={}", cert.display(), key.display()),
    ));
    assert_server_refuses("a foreign client certificate", foreign.unwrap()).await;

    let (cert, key) = tls.client_identity();
    let url = tls.url(
        "",
        "",
        &format!("&tls_cert={}&tls_key={}", cert.display(), key.display()),
    );
    let backend = EtcdBackend::connect(&url).await.unwrap();
    lock_cycle(&backend, &name("mtls")).await;
}

/// Turns on etcd auth: `root` (needed by `auth enable`), role `locks` with
/// read-write on `prefix`, user `app` in it, and user `nobody` in no role.
async fn enable_auth(client: &mut Client, prefix: &str, password: &str) {
    client.user_add("root", "r00t-pw", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.role_add("locks").await.unwrap();
    client
        .role_grant_permission("locks", Permission::read_write(prefix).with_prefix())
        .await
        .unwrap();
    client.user_add("app", password, None).await.unwrap();
    client.user_grant_role("app", "locks").await.unwrap();
    client.user_add("nobody", password, None).await.unwrap();
    client.auth_enable().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_passwords_over_tls() {
    let tls = Tls::start(false).await;
    let password = "s3cret-over-tls";
    let tls_options = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(tls.ca_file()).unwrap()));
    let mut admin = Client::connect(
        [tls.store.endpoint()],
        Some(ConnectOptions::new().with_tls(tls_options)),
    )
    .await
    .unwrap();
    enable_auth(&mut admin, "app-locks/", password).await;

    let config =
        EtcdConfig::from_url(&tls.url(&format!("app:{password}@"), "/app-locks/", "")).unwrap();
    let backend = connect(config.clone()).await.unwrap();
    lock_cycle(&backend, &name("auth")).await;
    for shown in [
        format!("{config:?}"),
        format!("{config:#?}"),
        format!("{backend:?}"),
    ] {
        assert!(!shown.contains(password), "password shown: {shown}");
    }

    // A wrong password is final (retrying cannot fix it) and not echoed.
    let started = Instant::now();
    let wrong = connect(config.clone().user("app", "not-the-password")).await;
    assert!(
        !format!("{wrong:?}").contains("not-the-password"),
        "{wrong:?}"
    );
    assert_refused("a wrong password", wrong, started, "authentication failed");

    // A user without permission on the prefix is refused at connect,
    // permanently, told what to grant.
    let err = connect(config.clone().user("nobody", password))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Store { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert!(err.to_string().contains("readwrite"), "{err}");
}
