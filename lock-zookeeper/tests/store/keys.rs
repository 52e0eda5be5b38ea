//! Where things live in ZooKeeper: every name is one child of the root,
//! whatever its characters; sequence numbers restart with a recreated
//! parent while fences do not; and the holder's label is the queue node's
//! data, written in the create (a node written without one, by an older
//! version of this crate or another recipe, is still a holder, with no
//! label).

use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::testing::decode_segment;
use lock_zookeeper::{ZooKeeperBackend, zk};
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{HolderLabel, LockBackend, LockName, ReleaseOutcome};
use uuid::Uuid;

use crate::support::{children, connect, delete_parent, raw, take, unique};

/// The label is the data of the node, as `zkCli get` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_label_is_the_nodes_data() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("label-data");
    let label = HolderLabel::new("settlement worker 3").unwrap();
    let ttl = a.capabilities().effective_ttl(a.session_timeout()).unwrap();
    let request = LockRequest::new(name.clone(), ttl).with_label(label.clone());
    let lease = a.try_acquire(&request).await.unwrap().into_lease().unwrap();
    let parent = a.lock_path(&name);
    let nodes = observer.list_children(&parent).await.unwrap();
    let (data, _) = observer
        .get_data(&format!("{parent}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(data, label.as_str().as_bytes());
    let holder = a.inspect(&name).await.unwrap().expect("held");
    assert_eq!(holder.label, Some(label));
    assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::Released);
}

/// A node created with no data (as versions before labels did) or with data
/// that is no label is inspected as a holder with no label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_written_without_a_label_show_none() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let writer = raw(&store.endpoint()).await;
    for (what, data) in [("no data", &b""[..]), ("not UTF-8", &[0xc3, 0x28][..])] {
        let name = unique("label-less");
        let parent = a.lock_path(&name);
        let open = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        writer.create(&parent, &[], &open).await.unwrap();
        let guid = Uuid::new_v4();
        let prefix = format!("{parent}/_c_{}-lock-", guid.hyphenated());
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (stat, _) = writer.create(&prefix, data, &mode).await.unwrap();
        let holder = a.inspect(&name).await.unwrap().expect("held");
        assert_eq!(holder.label, None, "{what}");
        assert_eq!(holder.fence.get(), stat.czxid as u64, "{what}");
        assert_eq!(holder.owner.map(|o| o.as_uuid()), Some(guid), "{what}");
    }
}

/// Every lock name is one child of the root, whatever it contains: the
/// segment decodes back to the name, nothing lands outside the root, and
/// the lock node is a direct child of that segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_are_single_children_of_the_root() {
    let store = zookeeper::shared();
    let root = format!("/zk-tests-names-{}", uuid::Uuid::new_v4().simple());
    let a = ZooKeeperBackend::connect_with(
        lock_zookeeper::ZooKeeperConfig::new(store.endpoint())
            .root(root.clone())
            .session_timeout(crate::support::session_timeout()),
    )
    .await
    .unwrap();
    let observer = raw(&store.endpoint()).await;
    let long_x = "x".repeat(255);
    let long_slash = "/".repeat(255);
    let names = [
        "a/b",
        "a%2Fb",
        ".",
        "..",
        "../../escape",
        "/zookeeper/quota",
        "zookeeper",
        "emoji 🔒",
        "\u{e000}private",
        "\u{fff0}",
        "\u{fffd}",
        "Ünïcode",
        &long_x,
        &long_slash,
    ]
    .map(|n| LockName::new(n).unwrap());
    // Held through a Locker: a lease nobody renews lasts a session timeout,
    // shorter than this test may take on a busy machine.
    let locker = lockcore::Locker::new(a.clone()).ttl(a.session_timeout());
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locker.try_acquire(name).await.unwrap().expect("free"));
    }
    let mut segments = children(&observer, &root).await;
    segments.sort();
    assert_eq!(
        segments.len(),
        names.len(),
        "one parent per name: {segments:?}"
    );
    let mut decoded: Vec<String> = segments
        .iter()
        .map(|s| decode_segment(s).unwrap())
        .collect();
    let mut expected: Vec<String> = names.iter().map(|n| n.as_str().to_owned()).collect();
    decoded.sort();
    expected.sort();
    assert_eq!(decoded, expected);
    for name in &names {
        let path = a.lock_path(name);
        assert_eq!(
            path.matches('/').count(),
            root.matches('/').count() + 1,
            "{path}"
        );
        assert_eq!(children(&observer, &path).await.len(), 1, "{path}");
    }
    let outside = children(&observer, "/").await;
    assert!(
        !outside.iter().any(|c| c == "escape" || c == "b"),
        "{outside:?}"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    drop(a);
    for s in segments {
        let _ = observer.delete(&format!("{root}/{s}"), None).await;
    }
    let _ = observer.delete(&root, None).await;
}

/// When a lock's parent is deleted (as the server's container reaper does
/// once it is empty, see `containers.rs`) and recreated, ZooKeeper restarts
/// its sequence numbers at 0, yet fences keep growing: they are czxids, not
/// sequences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parent_recreation_restarts_sequences_but_never_fences() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("recreated-parent");
    let parent = a.lock_path(&name);

    let mut last = None;
    for _ in 0..5 {
        let lease = take(&a, &name).await;
        assert!(last < Some(lease.fence()));
        last = Some(lease.fence());
        a.release(&lease).await.unwrap();
    }
    // What the server's container reaper does to an empty parent.
    delete_parent(&observer, &parent).await;
    let lease = take(&a, &name).await;
    let nodes = children(&observer, &parent).await;
    assert_eq!(nodes.len(), 1);
    assert!(
        nodes[0].ends_with("-lock-0000000000"),
        "the sequence restarted: {nodes:?}"
    );
    assert!(Some(lease.fence()) > last, "the fence did not restart");
    a.release(&lease).await.unwrap();
}
