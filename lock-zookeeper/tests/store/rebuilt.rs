//! Leases that are no grant (any more): one rebuilt around a real grant
//! (its node, carried along) with another name, owner, fence or access,
//! and one its owner released. Neither acts on anything: the node is
//! released and renewed only through the lease it was granted as, and
//! only while it holds.

use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::testing::with_grant_of;

use lockcore::backend::LockBackendExt;
use lockcore::{Access, FencingToken, Lease, LockBackend, LockError, OwnerToken, ReleaseOutcome};

use crate::support::{connect, take, unique, until_node_watched};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_rebuilt_around_a_grant_acts_on_nothing() {
    let store = zookeeper::shared();
    let backend = connect(store.endpoint()).await.unwrap();
    let name = unique("rebuilt");
    let lease = take(&backend, &name).await;
    let (ttl, sent) = (lease.ttl(), lease.issued());
    let later = FencingToken::new(lease.fence().get() + 1).unwrap();
    let rebuilt = [
        (
            "another name",
            Lease::new(
                unique("rebuilt-elsewhere"),
                lease.owner(),
                lease.fence(),
                ttl,
                sent,
            ),
        ),
        (
            "another owner",
            Lease::new(name.clone(), OwnerToken::new(), lease.fence(), ttl, sent),
        ),
        (
            "another fence",
            Lease::new(name.clone(), lease.owner(), later, ttl, sent),
        ),
        ("another access", lease.clone().with_access(Access::Write)),
    ];
    for (what, lease_of) in rebuilt {
        let forged = with_grant_of(lease_of, &lease);
        let renewed = backend.renew(&forged).await;
        assert!(
            matches!(renewed, Err(LockError::NotHeld { .. })),
            "renew of the grant with {what}: {renewed:?}"
        );
        let released = backend.release(&forged).await.unwrap();
        assert_eq!(
            released,
            ReleaseOutcome::NotHeld,
            "release of the grant with {what}"
        );
        let holder = backend.inspect(&name).await.unwrap();
        assert_eq!(
            holder.map(|h| h.fence),
            Some(lease.fence()),
            "the holder's node after a release with {what}"
        );
    }
    assert!(
        backend.renew(&lease).await.is_ok(),
        "the holder's own renew"
    );
    assert_eq!(
        backend.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A lease its owner released is over for good: a later renew or release
/// says not held, and its loss signal never fires (it was let go, not
/// lost), also once the client has heard its node's deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_never_lost_afterwards() {
    let store = zookeeper::shared();
    let backend = connect(store.endpoint()).await.unwrap();
    let name = unique("released");
    let lease = take(&backend, &name).await;
    // Held until the client watches its node (it hears the deletion then).
    until_node_watched(&store, &backend, &name).await;
    assert_eq!(
        backend.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    for _ in 0..2 {
        let renewed = backend.renew(&lease).await;
        assert!(
            matches!(renewed, Err(LockError::NotHeld { .. })),
            "renew after the release: {renewed:?}"
        );
        assert_eq!(
            backend.release(&lease).await.unwrap(),
            ReleaseOutcome::NotHeld
        );
    }
    assert!(
        !lease.loss_signal().unwrap().is_cancelled(),
        "the released lease was reported lost"
    );
}
