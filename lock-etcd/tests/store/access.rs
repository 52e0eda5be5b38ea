//! Users and roles: a user without permission on the prefix is refused
//! permanently, and the password is never printed.

use std::time::Duration;

use lock_etcd::etcd_client::Permission;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_roles_are_enforced_and_secrets_never_printed() {
    let store = private_etcd().await;
    let url = store.endpoint();
    let mut root = with_root_user(&url).await;
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
