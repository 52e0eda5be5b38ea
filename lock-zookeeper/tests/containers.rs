//! Empty lock parents are container nodes: the server deletes them, and the
//! next acquisition recreates the parent (sequence numbers restart at 0)
//! with a larger fence.
//!
//! A test binary of its own, not a module of `tests/store`: it sets
//! `JAVA_TOOL_OPTIONS` before any thread exists, so that its private server
//! checks containers every 100 ms instead of every minute. In a shared
//! binary, other tests' threads would be reading the environment, and
//! every server launched afterwards would inherit the setting.

#[path = "store/support.rs"]
mod support;

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::stores::zookeeper;
use lockcore::LockBackend;
use lockcore::backend::LockBackendExt;
use support::{children, connect, raw, take, unique};

/// Runs alone in its own test binary: it sets the environment before any
/// other thread exists, so the private server's JVM checks containers every
/// 100 ms instead of every minute.
#[test]
fn empty_parents_are_deleted_by_the_server_and_fences_keep_growing() {
    if !support::may_launch_servers(
        "empty_parents_are_deleted_by_the_server_and_fences_keep_growing",
    ) {
        return;
    }
    // SAFETY: the only test of this binary, run before any thread of ours
    // exists; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("JAVA_TOOL_OPTIONS", "-Dznode.container.checkIntervalMs=100") };
    let store = zookeeper::start(zookeeper::Options::default()).expect("a private zookeeper");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
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
                Duration::from_secs(10),
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
        });
}
