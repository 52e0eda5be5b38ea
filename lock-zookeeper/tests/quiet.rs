//! The sequence proof on the wire: a session that released the only node of
//! a queue takes it again with a create alone, and never when anything else
//! happened to the queue in between (another node, a recreated parent, a
//! broken connection).

mod support;

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, zk};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockName, ReleaseOutcome};
use support::{answered, behind_proxy, children, connect, raw, session_id, take, unique};
use tokio::time::timeout;
use uuid::Uuid;

async fn cycle(backend: &ZooKeeperBackend, name: &LockName) -> lockcore::FencingToken {
    let lease = backend
        .try_acquire_for(name, backend.session_timeout())
        .await
        .unwrap()
        .into_lease()
        .expect("the lock is free");
    let fence = lease.fence();
    assert_eq!(
        backend.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    fence
}

/// A queue node as another client (Curator, `zookeeper-client`, another
/// distlock process) would create it.
async fn queue_node(client: &zk::Client, parent: &str) -> String {
    let prefix = format!("{parent}/_c_{}-lock-", Uuid::new_v4().hyphenated());
    let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, sequence) = client.create(&prefix, &[], &mode).await.unwrap();
    format!("{prefix}{sequence}")
}

/// Once a session released the only node of a queue, taking the lock again
/// costs a create and a delete: no listing, no watch. The first cycle lists
/// (and sets the one watch on the parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycles_send_only_create_and_delete() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let name = unique("only-create-delete");
    let sid = session_id(&a);

    let before = answered(store.addr(), sid);
    let mut last = cycle(&a, &name).await;
    let cold = answered(store.addr(), sid) - before;
    assert!(
        cold >= 3,
        "the first cycle lists the queue ({cold} requests)"
    );

    const CYCLES: u64 = 40;
    let before = answered(store.addr(), sid);
    for _ in 0..CYCLES {
        let fence = cycle(&a, &name).await;
        assert!(fence > last);
        last = fence;
    }
    let requests = answered(store.addr(), sid) - before;
    // Exactly 2 per cycle; a cycle that ran longer than a twentieth of the
    // session timeout on a loaded machine may add the granted node's watch.
    assert!(
        (2 * CYCLES..2 * CYCLES + CYCLES / 4).contains(&requests),
        "{requests} requests for {CYCLES} cycles"
    );
}

/// Someone else queued between two of our cycles: our create gets a later
/// number than the one vouched for, so the queue is listed, and the lock is
/// held by the other node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_voids_the_proof() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let other = raw(&store.endpoint()).await;
    let name = unique("another-node");
    let parent = a.lock_path(&name);
    cycle(&a, &name).await;
    cycle(&a, &name).await;

    let holder = queue_node(&other, &parent).await;
    let attempt = a.try_acquire_for(&name, a.session_timeout()).await.unwrap();
    assert!(matches!(attempt, Attempt::Held { .. }), "{attempt:?}");
    let left = children(&other, &parent).await;
    assert_eq!(left.len(), 1, "our node was removed: {left:?}");
    assert!(holder.ends_with(&left[0]));

    other.delete(&holder, None).await.unwrap();
    cycle(&a, &name).await;
}

/// The parent was deleted (as the container reaper does once it is empty)
/// and created again, and a node queued in it: our create gets exactly the
/// number vouched for, but in another parent, behind that node. The watch on
/// the old parent fired, so the queue is listed and the lock is not granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_parent_voids_the_proof() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let other = raw(&store.endpoint()).await;
    let name = unique("recreated-parent");
    let parent = a.lock_path(&name);
    cycle(&a, &name).await; // sequence 0; the next create would get 1

    other.delete(&parent, None).await.unwrap();
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    other.create(&parent, &[], &container).await.unwrap();
    let holder = queue_node(&other, &parent).await;
    assert!(holder.ends_with("-lock-0000000000"));

    let attempt = a.try_acquire_for(&name, a.session_timeout()).await.unwrap();
    assert!(matches!(attempt, Attempt::Held { .. }), "{attempt:?}");
    // The parent's `cversion` counts child creations and deletions: the
    // holder's create (sequence 0), ours (sequence 1, the number vouched
    // for), and the removal of ours.
    let (_, stat) = other.get_children(&parent).await.unwrap();
    assert_eq!(stat.cversion, 3, "our create got sequence 1");

    other.delete(&holder, None).await.unwrap();
    cycle(&a, &name).await;
}

/// The connection broke and healed between two cycles, and meanwhile the
/// parent was recreated with a node in it: the proof is not used across a
/// reconnection, and the lock is not granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnection_voids_the_proof() {
    let (proxy, a, other) = behind_proxy().await;
    let name = unique("reconnected");
    let parent = a.lock_path(&name);
    cycle(&a, &name).await;

    let mut states = a.zk_client().unwrap().state_watcher();
    proxy.reset_existing();
    timeout(Duration::from_secs(5), async {
        while states.changed().await != zk::SessionState::Disconnected {}
    })
    .await
    .expect("the client notices the reset");
    other.delete(&parent, None).await.unwrap();
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    other.create(&parent, &[], &container).await.unwrap();
    let holder = queue_node(&other, &parent).await;

    let attempt = a.try_acquire_for(&name, a.session_timeout()).await.unwrap();
    assert!(matches!(attempt, Attempt::Held { .. }), "{attempt:?}");
    other.delete(&holder, None).await.unwrap();
    cycle(&a, &name).await;
}

/// A grant held past a twentieth of the session timeout gets a watch on its
/// node (one request, sent by the session's keeper), which turns a deletion
/// by someone else into the lease's loss signal, with no renewal involved.
/// A grant released sooner never costs that request (see above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_hold_is_watched_and_learns_of_its_eviction() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let other = raw(&store.endpoint()).await;
    let name = unique("kept");
    let parent = a.lock_path(&name);
    let sid = session_id(&a);
    let lease = take(&a, &name).await;
    let granted = answered(store.addr(), sid);
    eventually(
        a.session_timeout() / 2,
        "the keeper watching the node",
        || async { (answered(store.addr(), sid) > granted).then_some(()) },
    )
    .await;
    let node = children(&other, &parent).await.pop().unwrap();
    other
        .delete(&format!("{parent}/{node}"), None)
        .await
        .unwrap();
    timeout(
        Duration::from_secs(2),
        lease.loss_signal().unwrap().cancelled(),
    )
    .await
    .expect("the node watch fires the loss signal");
    assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::NotHeld);
    cycle(&a, &name).await;
}

/// Attempts of one session racing for a lock it just released alone: one
/// create gets the vouched number (the proof is taken once), the others get
/// later numbers, list the queue, and find it held. Never two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_attempts_of_one_session_never_share_the_lock() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let name = unique("racing");
    for _ in 0..25 {
        cycle(&a, &name).await; // alone: vouches for the next number
        let attempts: Vec<_> = (0..3)
            .map(|_| {
                let (a, name) = (a.clone(), name.clone());
                tokio::spawn(async move { a.try_acquire_for(&name, a.session_timeout()).await })
            })
            .collect();
        let mut leases = Vec::new();
        for attempt in attempts {
            if let Attempt::Acquired(lease) = attempt.await.unwrap().unwrap() {
                leases.push(lease);
            }
        }
        assert_eq!(leases.len(), 1, "exactly one of the racing attempts holds");
        a.release(&leases[0]).await.unwrap();
    }
}
