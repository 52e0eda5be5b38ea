//! Connecting: URL and TLS mistakes are typed errors, connect errors name
//! their cause within the connect timeout, the facade-style URL connects,
//! and a connection garbled mid-way is a retryable error that heals. (How
//! each URL option is read, old spellings included, is tested with the
//! parser, in `src/config/url/tests.rs`.)

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::etcd;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_url_mistakes_are_typed_errors() {
    let store = etcd::shared();
    let plain = store.addr();
    // TLS towards a plaintext server: a clean error, no panic, no hang.
    let started = Instant::now();
    let tls = EtcdBackend::connect(&format!("etcds://{plain}?timeout=2s")).await;
    let err = tls.unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. } | LockError::Store { .. }),
        "{err:?}"
    );
    assert!(started.elapsed() < scaled(Duration::from_secs(10)));
    for bad in [
        "etcd://",
        "etcd://h:1?tls_cert=/missing/cert.pem&tls_key=/missing/key.pem",
        "http://h:1",
    ] {
        let err = EtcdBackend::connect(bad).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{bad}: {err:?}"
        );
    }
    // Nobody listening: Unavailable, within the configured time.
    let nobody = EtcdConfig::new(["http://127.0.0.1:1"]).request_timeout(Duration::from_secs(1));
    let err = EtcdBackend::connect_with(nobody).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_name_their_cause_within_the_connect_timeout() {
    let connect_timeout = scaled(Duration::from_secs(2));
    let config = |endpoints: &[&str]| {
        EtcdConfig::new(endpoints.iter().copied()).connect_timeout(connect_timeout)
    };
    let failed = |config: EtcdConfig| async move {
        let started = Instant::now();
        let err = EtcdBackend::connect_with(config)
            .await
            .expect_err("connect must fail");
        let took = started.elapsed();
        assert!(took < connect_timeout, "{took:?} to report: {err}");
        err
    };

    // A closed port (with and without credentials, one or every endpoint):
    // retryable, and the message says the connection was refused.
    let closed = ["http://127.0.0.1:1", "http://127.0.0.1:2"];
    for config in [
        config(&closed[..1]),
        config(&closed),
        config(&closed[..1]).user("locker", "s3cret-pw"),
    ] {
        let err = failed(config).await;
        assert!(err.is_retryable(), "{err:?}");
        let text = err.to_string();
        assert!(text.to_lowercase().contains("connection refused"), "{text}");
        assert!(!text.contains("s3cret-pw"), "{text}");
    }

    // Wrong credentials: permanent, and the message says so.
    let store = private_etcd().await;
    let url = store.endpoint();
    let mut root = with_root_user(&url).await;
    root.auth_enable().await.unwrap();
    for (user, password) in [("root", "not-the-pw"), ("nobody", "not-the-pw")] {
        let err = failed(config(&[url.as_str()]).user(user, password)).await;
        assert!(matches!(err, LockError::Store { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("authentication failed"), "{text}");
        assert!(!text.contains("not-the-pw"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facade_style_url_connects() {
    let store = etcd::shared();
    let backend: Arc<dyn LockBackend> = Arc::new(
        EtcdBackend::connect(&format!("etcd://{}/url-test/", store.addr()))
            .await
            .unwrap(),
    );
    let lock = name("url");
    let lease = backend
        .try_acquire_for(&lock, Duration::from_secs(3))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert_eq!(
        backend.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A connection whose server preface was lost (the proxy dropped the
/// server's first bytes after a reset) fails its next requests with an
/// HTTP/2 protocol error: a transport fault like any other, so it must be
/// retryable (the nemesis case hit it as a permanent `Store` error), and
/// the client must recover once the network does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbled_connection_is_a_retryable_error_and_heals() {
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let timeout = scaled(Duration::from_millis(300));
    let client = EtcdBackend::connect_with(
        EtcdConfig::new([store.endpoint_via(proxy.addr())]).request_timeout(timeout),
    )
    .await
    .unwrap();
    let lock = name("garbled");
    let mut errors = Vec::new();
    for _ in 0..5 {
        proxy.set(Mode::DropDownstream);
        proxy.reset_existing();
        // Until the client has reconnected, with the server's preface
        // dropped: its request then goes unanswered.
        for _ in 0..10 {
            let sent = Instant::now();
            let Err(e) = client.inspect(&lock).await else {
                panic!("an answer through a proxy that drops every reply");
            };
            errors.push(e);
            if sent.elapsed() >= timeout {
                break;
            }
        }
        proxy.set(Mode::Pass);
        for _ in 0..3 {
            if let Err(e) = client.inspect(&lock).await {
                errors.push(e);
            }
        }
    }
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("protocol error")),
        "the garbled connection never showed: {errors:?}"
    );
    for e in &errors {
        assert!(
            e.is_retryable(),
            "a transport fault reported as permanent: {e:?}"
        );
    }
    until(
        Duration::from_secs(10),
        "the client serving again",
        || async { client.inspect(&lock).await.is_ok() },
    )
    .await;
    let lease = client
        .try_acquire_for(&lock, Duration::from_secs(4))
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    client.release(&lease).await.unwrap();
}
