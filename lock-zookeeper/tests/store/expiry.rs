//! A lease past its local deadline, unrenewed, while its session lives on
//! (the client's pings keep it): whichever call notices the expiry first (a
//! release, a renewal, `set_remaining`) deletes the node. Nothing else
//! would once that call has marked the grant expired: the name would stay
//! blocked for as long as the client runs. A delete the servers refuse for
//! good is left to the session's end, not retried for as long as it lives.

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, zk};
use lockcore::backend::LockBackendExt;
use lockcore::{Lease, LockBackend, LockError, LockName, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::{
    answered, children, connect, raw, session_id, short_lived, unique, until_node_watched,
};

/// A grant of `name` whose local deadline has just passed, with no task of
/// the client run since it was granted (this test's runtime has one
/// thread, and it sleeps through the deadline): the call that follows is
/// the first to look at the grant.
async fn expired(backend: &ZooKeeperBackend, name: &LockName) -> Lease {
    let lease = short_lived(backend, name, scaled(Duration::from_millis(300))).await;
    let past = lease.deadline() + Duration::from_millis(20);
    std::thread::sleep(past.saturating_duration_since(Instant::now()));
    assert!(
        Instant::now() >= lease.deadline(),
        "the lease is past its deadline"
    );
    lease
}

#[tokio::test]
async fn the_first_call_to_see_a_lease_expired_deletes_its_node() {
    let store = zookeeper::shared();
    let backend = connect(store.endpoint()).await.unwrap();
    let other = connect(store.endpoint()).await.unwrap();
    let session = session_id(&backend);
    for call in ["release", "renew", "set_remaining"] {
        let name = unique(&format!("expired-{call}"));
        let lease = expired(&backend, &name).await;
        match call {
            "release" => assert_eq!(
                backend.release(&lease).await.unwrap(),
                ReleaseOutcome::NotHeld
            ),
            "renew" => {
                let renewed = backend.renew(&lease).await;
                assert!(
                    matches!(renewed, Err(LockError::NotHeld { .. })),
                    "{renewed:?}"
                );
            }
            _ => {
                let kept = backend.set_remaining(&lease, lease.ttl()).await;
                assert!(matches!(kept, Err(LockError::NotHeld { .. })), "{kept:?}");
            }
        }
        eventually(
            scaled(Duration::from_secs(2)),
            &format!("the expired node deleted after {call}"),
            || async { other.inspect(&name).await.unwrap().is_none().then_some(()) },
        )
        .await;
        assert_eq!(
            session_id(&backend),
            session,
            "the session ended: it, not the client, deleted the node"
        );
    }
}

/// The client's delete of an expired node that fails for a reason no retry
/// can change (here the parent's ACL no longer lets anyone delete under
/// it) is tried once, then left to the session's end: not retried for as
/// long as the session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_delete_of_an_expired_node_is_not_retried() {
    let store = zookeeper::shared();
    let backend = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("expired-refused");
    let lease = short_lived(&backend, &name, scaled(Duration::from_secs(1))).await;
    let parent = backend.lock_path(&name);
    let no_delete = [zk::Acl::new(
        zk::Permission::READ | zk::Permission::CREATE | zk::Permission::ADMIN,
        zk::AuthId::anyone(),
    )];
    observer.set_acl(&parent, &no_delete, None).await.unwrap();
    let sid = session_id(&backend);
    // Its last request before the deadline: the keeper's watch on the node.
    until_node_watched(&store, &backend, &name).await;
    let before = answered(store.addr(), sid);
    assert!(
        Instant::now() < lease.deadline(),
        "watched only past the deadline"
    );
    eventually(
        scaled(Duration::from_secs(5)),
        "the client's delete of its expired node",
        || async { (answered(store.addr(), sid) > before).then_some(()) },
    )
    .await;
    assert!(Instant::now() >= lease.deadline());
    let tried = answered(store.addr(), sid);
    // Retries would come within 20 ms, 40 ms, 80 ms ... of each other.
    tokio::time::sleep(scaled(Duration::from_millis(1500))).await;
    assert_eq!(
        answered(store.addr(), sid),
        tried,
        "the refused delete was tried again"
    );
    assert_eq!(
        children(&observer, &parent).await.len(),
        1,
        "the node is left"
    );
    let open = [zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone())];
    observer.set_acl(&parent, &open, None).await.unwrap();
}
