//! A grant's transaction whose reply is lost, against a real server behind
//! a proxy.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lockcore::Access;
use lockcore::backend::Cleanups;
use uuid::Uuid;

use super::*;
use crate::config::ZooKeeperConfig;
use crate::connection::session::Session;
use crate::keys::acls::Acls;

/// The reply to a read's grant transaction is lost (the server applied it:
/// the node was created again): once the connection is back, the grant
/// finds the node created again by its new `czxid` and takes that as its
/// fence, instead of failing or granting on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_reply_finds_the_node_created_again() {
    let store = lock_conformance::kit::stores::zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let config = ZooKeeperConfig::new(store.endpoint_via(proxy.addr()));
    let session = Session::open(&config).await.unwrap();
    let observer = zk::Client::connect(&store.endpoint()).await.unwrap();
    let parent = format!("/zk-unit-rw-grant-{}", Uuid::new_v4().simple());
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.create(&parent, &[], &open).await.unwrap();
    let acls = Arc::new(Acls::new(false));
    let mut entry = Entry::new(session.clone(), parent.clone(), acls, Cleanups::new(), None);
    entry.access = Some(Access::Read);
    entry.enqueue(true).await.unwrap();
    let queued = entry.node.clone().unwrap();
    assert!(queued.name.contains("-__READ__"), "{}", queued.name);

    proxy.set(Mode::DropDownstream);
    let granting = tokio::spawn(async move {
        let taken = entry.take_fence().await;
        (entry, taken)
    });
    let created = eventually(
        Duration::from_secs(5),
        "the server applying the grant",
        || async {
            let stat = observer.check_stat(&queued.path).await.unwrap();
            stat.filter(|s| s.czxid != queued.czxid).map(|s| s.czxid)
        },
    )
    .await;
    proxy.set(Mode::Pass);
    proxy.reset_existing();
    let (entry, taken) = tokio::time::timeout(session.timeout * 2, granting)
        .await
        .expect("the grant completes after reconnecting")
        .unwrap();
    assert!(taken.unwrap(), "the node is there");
    let node = entry.node.clone().unwrap();
    assert_eq!((node.czxid, &node.path), (created, &queued.path));
    assert_eq!(node.fence().unwrap().get(), created as u64);
    let (_, stat) = observer.get_data(&node.path).await.unwrap();
    assert_eq!(stat.ephemeral_owner, session.id(), "still the session's");
    entry.remove().await.unwrap();
    observer.delete(&parent, None).await.unwrap();
}
