//! Holder labels on the wire: the label is the queue node's data, written in
//! the create, and a node written without one (an older version of this
//! crate, another recipe) is still a holder, with no label.

mod support;

use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::zk;
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::{HolderLabel, LockBackend, ReleaseOutcome};
use support::{connect, raw, unique};
use uuid::Uuid;

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
