//! A multi-lock's transaction against a real server: refused whole on a
//! stale read, and found again after a lost reply.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lockcore::backend::Cleanups;
use uuid::Uuid;

use super::*;
use crate::config::ZooKeeperConfig;
use crate::connection::session::Session;
use crate::keys::acls::Acls;

/// A base node of its own and `n` lock parents under it (not created).
async fn parents(observer: &zk::Client, n: usize) -> (String, Vec<String>) {
    let base = format!("/zk-unit-multi-{}", Uuid::new_v4().simple());
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.create(&base, &[], &open).await.unwrap();
    (
        base.clone(),
        (0..n).map(|i| format!("{base}/p{i}")).collect(),
    )
}

fn entries(session: &Arc<Session>, parents: &[String]) -> Vec<Entry> {
    let acls = Arc::new(Acls::new(false));
    (parents.iter())
        .map(|p| {
            Entry::new(
                session.clone(),
                p.clone(),
                acls.clone(),
                Cleanups::new(),
                None,
            )
        })
        .collect()
}

/// Refused whole: a queue that changed since the read (a node queued in a
/// parent read empty) is a name held, a parent that came since the read is
/// a change; either way no parent was deleted or created, and no node
/// queued. Read right, the transaction queues a node in every parent, the
/// parents created again (sequences from 0), every node with its zxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_queue_refuses_the_whole_transaction() {
    let store = lock_conformance::kit::stores::zookeeper::shared();
    let session = Session::open(&ZooKeeperConfig::new(store.endpoint()))
        .await
        .unwrap();
    let observer = zk::Client::connect(&store.endpoint()).await.unwrap();
    let (base, parents) = parents(&observer, 3).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for parent in &parents[..2] {
        observer.create(parent, &[], &open).await.unwrap();
    }
    let theirs = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{}/{}", parents[1], node_prefix(Uuid::new_v4(), None));
    let (_, sequence) = observer.create(&prefix, &[], &theirs).await.unwrap();
    let before: Vec<_> =
        futures_util::future::join_all(parents.iter().map(|p| observer.check_stat(p))).await;
    let client = session.client().unwrap();
    let mut entries = entries(&session, &parents);

    // Read before their node queued: p0 and p1 empty, p2 missing.
    let sent = send(&client, &mut entries, &[false, false, true], 0).await;
    assert!(matches!(sent, Ok(Sent::Held(1))), "{:?}", sent.err());
    // Read before p0 was created: missing.
    let sent = send(&client, &mut entries, &[true, false, true], 0).await;
    assert!(matches!(sent, Ok(Sent::Changed(0))), "{:?}", sent.err());
    let after: Vec<_> =
        futures_util::future::join_all(parents.iter().map(|p| observer.check_stat(p))).await;
    assert_eq!(before, after, "a refused transaction changed a parent");
    assert!(entries.iter().all(|e| e.node.is_none()));
    assert_eq!(
        observer.list_children(&parents[0]).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(observer.list_children(&parents[1]).await.unwrap().len(), 1);

    observer
        .delete(&format!("{prefix}{sequence}"), None)
        .await
        .unwrap();
    let sent = send(&client, &mut entries, &[false, false, true], 7).await;
    assert!(matches!(sent, Ok(Sent::Applied)), "{:?}", sent.err());
    let mut czxids = Vec::new();
    for entry in &entries {
        let node = entry.node.clone().unwrap();
        assert!(node.name.ends_with("-lock-0000000000"), "{}", node.name);
        assert_eq!(node.sequence, Some(0));
        let (data, stat) = observer.get_data(&node.path).await.unwrap();
        assert_eq!(stat.czxid, node.czxid);
        assert_eq!(stat.ephemeral_owner, session.id());
        assert_eq!(NodeData::decode(&data).offset, 7);
        assert_eq!(node.fence().unwrap().get(), node.czxid as u64 + 7);
        let parent = observer.check_stat(&entry.parent).await.unwrap().unwrap();
        assert_eq!(parent.czxid, node.czxid, "the parent created with it");
        czxids.push(node.czxid);
    }
    assert!(
        czxids.windows(2).all(|w| w[0] == w[1]),
        "one zxid: {czxids:?}"
    );
    undo(&client, &mut entries).await.unwrap();
    for entry in entries {
        entry.remove().await.unwrap();
    }
    for parent in &parents {
        let _ = observer.delete(parent, None).await;
    }
    observer.delete(&base, None).await.unwrap();
}

/// The reply to an applied transaction is lost: once the connection is
/// back, every node is found by its owner's uuid, with its `czxid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_finds_every_node() {
    let store = lock_conformance::kit::stores::zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let config = ZooKeeperConfig::new(store.endpoint_via(proxy.addr()));
    let session = Session::open(&config).await.unwrap();
    let observer = zk::Client::connect(&store.endpoint()).await.unwrap();
    let (base, parents) = parents(&observer, 2).await;
    let entries = entries(&session, &parents);

    proxy.set(Mode::DropDownstream);
    let sending = tokio::spawn({
        let session = session.clone();
        async move {
            let mut entries = entries;
            let client = session.client().unwrap();
            let sent = send(&client, &mut entries, &[true, true], 0).await;
            (entries, sent)
        }
    });
    let applied = eventually(Duration::from_secs(5), "the server applying it", || async {
        let mut nodes = Vec::new();
        for parent in &parents {
            nodes.extend(observer.list_children(parent).await.ok()?);
        }
        (nodes.len() == 2).then_some(nodes)
    })
    .await;
    proxy.set(Mode::Pass);
    proxy.reset_existing();
    let (mut entries, sent) = tokio::time::timeout(session.timeout * 2, sending)
        .await
        .expect("the attempt completes after reconnecting")
        .unwrap();
    assert!(matches!(sent, Ok(Sent::Applied)), "{:?}", sent.err());
    for (entry, name) in entries.iter().zip(&applied) {
        let node = entry.node.clone().unwrap();
        assert_eq!(&node.name, name);
        let stat = observer.check_stat(&node.path).await.unwrap().unwrap();
        assert_eq!(
            (stat.czxid, stat.ephemeral_owner),
            (node.czxid, session.id())
        );
        assert!(
            entry.strays,
            "a lost reply may leave strays: swept at release"
        );
    }
    let client = session.client().unwrap();
    undo(&client, &mut entries).await.unwrap();
    for entry in entries {
        entry.remove().await.unwrap();
    }
    for parent in &parents {
        let _ = observer.delete(parent, None).await;
    }
    observer.delete(&base, None).await.unwrap();
}
