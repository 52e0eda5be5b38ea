//! A stray node of ours ahead of ours, against a real server.

use super::*;
use crate::config::ZooKeeperConfig;

/// A create sent through a lost connection may land after the client
/// looked for it and made another node: if that stray lands ahead of the
/// new node, `prune` deletes it so the client does not wait behind
/// itself (and block everyone behind it) until its session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_of_ours_ahead_of_our_node_is_deleted() {
    let store = lock_conformance::kit::stores::zookeeper::shared();
    let config = ZooKeeperConfig::new(store.endpoint());
    let session = Session::open(&config).await.unwrap();
    let acls = Arc::new(Acls::new(false));
    let parent = format!("/zk-unit-prune-{}", Uuid::new_v4().simple());
    let cleanups = Cleanups::new();
    let mut entry = Entry::new(session.clone(), parent.clone(), acls, cleanups, None);
    let client = session.client().unwrap();
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create(&parent, &[], &open).await.unwrap();
    // The "late" create of the lost reply, landing first.
    let stray = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/{}", node_prefix(entry.guid, None));
    client.create(&prefix, &[], &stray).await.unwrap();

    let queue = entry.enqueue(true).await.unwrap().unwrap();
    assert_eq!(
        queue.position(entry.name().unwrap()),
        Some(1),
        "behind our own stray"
    );
    assert!(
        entry.prune(&queue).await.unwrap().is_none(),
        "nothing pruned without a lost reply"
    );
    entry.strays = true;
    let queue = entry
        .prune(&queue)
        .await
        .unwrap()
        .expect("the stray was deleted");
    assert_eq!(queue.position(entry.name().unwrap()), Some(0));
    assert_eq!(client.list_children(&parent).await.unwrap().len(), 1);
    entry.remove().await.unwrap();
    client.delete(&parent, None).await.unwrap();
}
