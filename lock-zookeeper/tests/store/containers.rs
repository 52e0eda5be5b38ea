//! Empty lock parents are container nodes: the server deletes them, and the
//! next acquisition recreates the parent (sequence numbers restart at 0)
//! with a larger fence. (The kit's servers check containers every 200 ms,
//! not every minute: `Options::container_check_ms`.)

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::stores::zookeeper;
use lockcore::LockBackend;
use lockcore::backend::LockBackendExt;

use crate::support::{children, connect, container_check_interval, raw, take, unique};

/// An emptied parent goes at the server's next sweep; the next grant
/// creates it again, numbering from 0, with a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_parents_are_deleted_by_the_server_and_fences_keep_growing() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("container");
    let parent = a.lock_path(&name);
    let ttl = a.session_timeout();

    let first = take(&a, &name).await;
    let waiter = connect(store.endpoint()).await.unwrap();
    let queued = waiter.try_acquire_for(&name, ttl).await.unwrap();
    assert!(queued.into_lease().is_none());
    a.release(&first).await.unwrap();
    eventually(
        container_check_interval() * 4 + Duration::from_secs(10),
        "the server deleting the empty parent",
        || async {
            observer
                .check_stat(&parent)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;

    let second = take(&a, &name).await;
    let nodes = children(&observer, &parent).await;
    assert!(
        nodes[0].ends_with("-lock-0000000000"),
        "the sequence restarted: {nodes:?}"
    );
    assert!(second.fence() > first.fence(), "the fence did not");
    a.release(&second).await.unwrap();
}
