//! Access: with digest credentials, lock nodes belong to that identity, and
//! another identity is refused at connect.

use std::time::{Duration, Instant};

use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig, zk};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError, ReleaseOutcome};

use crate::support::{children, take, unique};
use lock_conformance::kit::scaled;

fn config(url: &str, root: &str) -> ZooKeeperConfig {
    crate::support::config(url).root(root)
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
/// or re-ACL the holder's node, cannot queue, and cannot even connect a
/// backend to that root (refused at once, naming the credentials); the same
/// identity on another connection can force-release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_acl_keeps_other_identities_off_the_lock_nodes() {
    let store = zookeeper::shared();
    let url = store.endpoint();
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
        let (acl, _) = alice.client().unwrap().get_acl(&node).await.unwrap();
        assert!(
            acl.iter()
                .all(|a| a.scheme() == "digest" && a.id().starts_with("alice:")),
            "{acl:?}"
        );
    }

    // Another identity (or a wrong password) is refused at connect, saying
    // why, rather than at every acquire.
    for (who, wrong) in [
        ("mallory", config(&url, &root).digest("mallory", "guess")),
        (
            "alice with a wrong password",
            config(&url, &root).digest("alice", "guess"),
        ),
        ("anonymous", config(&url, &root)),
    ] {
        let started = Instant::now();
        let refused = ZooKeeperBackend::connect_with(wrong).await.unwrap_err();
        assert!(
            matches!(refused, LockError::Store { .. }),
            "{who}: {refused:?}"
        );
        let said = refused.to_string();
        eprintln!("{who}: refused after {:?}: {said}", started.elapsed());
        assert!(
            said.contains("check the digest credentials") && said.contains("digest:alice"),
            "{who}: {said}"
        );
        assert!(
            !said.contains("s3cret") && !said.contains("guess"),
            "{said}"
        );
        assert!(
            started.elapsed() < scaled(Duration::from_secs(1)),
            "{who}: {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        alice.inspect(&name).await.unwrap().map(|h| h.fence),
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
