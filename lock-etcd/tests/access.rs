//! Reaching etcd: users and roles, URL and TLS mistakes, connect errors,
//! the facade-style URL.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::stores::etcd;
use lock_etcd::etcd_client::Permission;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError, ReleaseOutcome};
use support::*;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_roles_are_enforced_and_secrets_never_printed() {
    let store = tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default()))
        .await
        .unwrap()
        .expect("a private etcd for auth");
    let url = store.endpoint();
    let mut root = raw(&url).await;
    root.user_add("root", "r00t-secret", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.role_add("app-locks").await.unwrap();
    root.role_grant_permission("app-locks", Permission::read_write("app/").with_prefix())
        .await
        .unwrap();
    root.user_add("locker", "s3cret-pw", None).await.unwrap();
    root.user_grant_role("locker", "app-locks").await.unwrap();
    root.auth_enable().await.unwrap();

    let config = EtcdConfig::new([url.as_str()])
        .prefix("app/")
        .user("locker", "s3cret-pw");
    let backend = EtcdBackend::connect_with(config.clone()).await.unwrap();
    for shown in [format!("{config:?}"), format!("{backend:?}")] {
        assert!(!shown.contains("s3cret-pw"), "{shown}");
    }
    let lock = name("rbac");
    let lease = acquire(&backend, &lock, Duration::from_secs(5)).await;
    assert_eq!(
        backend.inspect(&lock).await.unwrap().unwrap().fence,
        lease.fence()
    );
    backend.release(&lease).await.unwrap();

    // Outside its prefix the same user is refused at connect, permanently
    // (no retry storm), told what to grant.
    let outside = EtcdBackend::connect_with(config.clone().prefix("other/")).await;
    let refused = outside.unwrap_err();
    assert!(matches!(refused, LockError::Store { .. }), "{refused:?}");
    assert!(!refused.is_retryable());
    let text = refused.to_string();
    assert!(
        text.contains("permission denied") && text.contains("readwrite \"other/\""),
        "{text}"
    );

    // Wrong password and no credentials: typed errors, secrets not echoed.
    let wrong = EtcdBackend::connect_with(config.clone().user("locker", "not-the-pw")).await;
    let err = wrong.unwrap_err();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    assert!(!err.to_string().contains("not-the-pw"));
    // etcd 3.4 lets anyone grant leases, but an anonymous client cannot
    // read a single key: refused at connect.
    let anonymous = EtcdBackend::connect_with(EtcdConfig::new([url.as_str()]).prefix("app/")).await;
    let refused = anonymous.unwrap_err();
    assert!(matches!(refused, LockError::Store { .. }), "{refused:?}");
    assert!(!refused.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_url_mistakes_are_typed_errors() {
    let store = etcd::shared();
    let plain = store.addr();
    // TLS towards a plaintext server: a clean error, no panic, no hang.
    let started = Instant::now();
    let tls = EtcdBackend::connect(&format!("etcds://{plain}?timeout=2")).await;
    let err = tls.unwrap_err();
    assert!(
        matches!(err, LockError::Unavailable { .. } | LockError::Store { .. }),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    for bad in [
        "etcd://",
        "etcd://h:1?cert=/missing/cert.pem&key=/missing/key.pem",
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
    let store = tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default()))
        .await
        .unwrap()
        .expect("a private etcd for auth");
    let url = store.endpoint();
    let mut root = raw(&url).await;
    root.user_add("root", "r00t-secret", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
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
