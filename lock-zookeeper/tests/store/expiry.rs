//! A lease past its local deadline, unrenewed, while its session lives on
//! (the client's pings keep it): whichever call notices the expiry first (a
//! release, a renewal, `set_remaining`) deletes the node. Nothing else
//! would once that call has marked the grant expired: the name would stay
//! blocked for as long as the client runs.

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::ZooKeeperBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{Lease, LockBackend, LockError, LockName, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::{connect, session_id, short_lived, unique};

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
