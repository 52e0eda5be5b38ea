//! Digest ACLs, bad configuration and unreachable servers.

mod support;

use std::time::Duration;

use lock_conformance::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig, zk};
use lockcore::{LockBackend, LockError, ReleaseOutcome};
use support::{children, session_timeout, take, unique};

fn config(url: &str, root: &str) -> ZooKeeperConfig {
    ZooKeeperConfig::new(url)
        .root(root)
        .session_timeout(session_timeout())
}

async fn client_as(url: &str, user: &str, password: &str) -> zk::Client {
    zk::Client::connector()
        .with_auth("digest", format!("{user}:{password}").as_bytes())
        .connect(url)
        .await
        .unwrap()
}

/// With digest credentials, lock nodes belong to that identity: another
/// identity (or none) can read who holds a lock but cannot delete, overwrite
/// or re-ACL the holder's node, cannot queue, and cannot force-release; the
/// same identity on another connection can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_acl_keeps_other_identities_off_the_lock_nodes() {
    let store = zookeeper::shared();
    let url = store.url();
    let root = format!("/zk-tests-acl-{}", uuid::Uuid::new_v4().simple());
    let alice = ZooKeeperBackend::connect_with(config(&url, &root).digest("alice", "s3cret"))
        .await
        .unwrap();
    let name = unique("acl");
    let lease = take(&alice, &name).await;
    let parent = alice.lock_path(&name);

    for (who, intruder) in [
        ("mallory", client_as(&url, "mallory", "guess").await),
        ("anonymous", zk::Client::connect(&url).await.unwrap()),
    ] {
        let nodes = children(&intruder, &parent).await;
        assert_eq!(nodes.len(), 1, "{who} may read the queue");
        let node = format!("{parent}/{}", nodes[0]);
        assert_eq!(
            intruder.delete(&node, None).await,
            Err(zk::Error::NoAuth),
            "{who} deletes"
        );
        assert_eq!(
            intruder.set_data(&node, b"x", None).await.map(|_| ()),
            Err(zk::Error::NoAuth),
            "{who} writes"
        );
        let open = zk::Acls::anyone_all();
        assert_eq!(
            intruder.set_acl(&node, &open, None).await.map(|_| ()),
            Err(zk::Error::NoAuth),
            "{who} re-ACLs"
        );
        let queue = zk::CreateMode::EphemeralSequential.with_acls(open);
        assert_eq!(
            intruder
                .create(&format!("{parent}/_c_x-lock-"), b"", &queue)
                .await
                .map(|_| ()),
            Err(zk::Error::NoAuth),
            "{who} queues"
        );
        let (acl, _) = alice.zk_client().get_acl(&node).await.unwrap();
        assert!(
            acl.iter()
                .all(|a| a.scheme() == "digest" && a.id().starts_with("alice:")),
            "{acl:?}"
        );
    }

    let mallory = ZooKeeperBackend::connect_with(config(&url, &root).digest("mallory", "guess"))
        .await
        .unwrap();
    let refused = mallory.evict(&name, None).await;
    assert!(
        matches!(refused, Err(LockError::Store { .. })),
        "{refused:?}"
    );
    assert!(refused.unwrap_err().to_string().contains("not authorized"));
    let queued = mallory.try_acquire(&name, mallory.session_timeout()).await;
    assert!(matches!(queued, Err(LockError::Store { .. })), "{queued:?}");
    assert_eq!(
        mallory.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(lease.fence())
    );

    let alice2 = ZooKeeperBackend::connect_with(config(&url, &root).digest("alice", "s3cret"))
        .await
        .unwrap();
    let evicted = alice2.evict(&name, None).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    assert_eq!(
        alice.release(&lease).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
}

/// Bad URLs and settings are `InvalidConfig` before any I/O; a server that
/// is not there is `Unavailable` within the connect timeout; `Debug` never
/// shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_and_unreachable_servers_are_typed_errors() {
    for url in [
        "zk://h:1/a//b",
        "zk://h:1/zookeeper",
        "zk://h:1/x?bogus=1",
        "redis://h:1",
        "zk://h:1/x?session_timeout=soon",
    ] {
        let e = ZooKeeperBackend::connect(url).await.unwrap_err();
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{url}: {e:?}");
    }
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let started = std::time::Instant::now();
    let e = ZooKeeperBackend::connect_with(
        ZooKeeperConfig::new(closed.to_string()).connect_timeout(Duration::from_secs(3)),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, LockError::Unavailable { .. }), "{e:?}");
    assert!(e.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );

    let store = zookeeper::shared();
    let backend = ZooKeeperBackend::connect(&format!(
        "zk://alice:hunter2@{}/zk-tests-debug?session_timeout=4s",
        store.addr()
    ))
    .await
    .unwrap();
    let shown = format!("{backend:?} {:?}", backend.config());
    assert!(
        shown.contains("alice") && !shown.contains("hunter2"),
        "{shown}"
    );
}
