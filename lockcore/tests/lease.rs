//! What a lease tells about itself: its slot, and the time it has left.

use std::time::Duration;

use lockcore::backend::Moment;
use lockcore::{Capabilities, FencingToken, Lease, LockName, OwnerToken};

fn lease(ttl: Duration) -> Lease {
    Lease::new(
        LockName::new("n").unwrap(),
        OwnerToken::new(),
        FencingToken::new(1).unwrap(),
        Capabilities::new("test").effective_ttl(ttl).unwrap(),
        Moment::now(),
    )
}

#[test]
fn a_lease_is_a_lock_unless_it_holds_a_slot() {
    let lock = lease(Duration::from_secs(1));
    assert_eq!(lock.slot(), None);
    let permit = lock.clone().with_slot(3);
    assert_eq!(permit.slot(), Some(3));
    assert!(!lock.same_grant(&permit), "a permit is another grant");
    assert!(permit.same_grant(&permit.renewed(Moment::now())));
}

#[tokio::test(start_paused = true)]
async fn a_fresh_lease_has_its_whole_budget_left() {
    let ttl = Duration::from_secs(10);
    let fresh = lease(ttl);
    let budget = ttl - fresh.margin();
    let left = fresh.remaining();
    // The boot clock runs on while tokio's is paused: allow it a second.
    assert!(
        left <= budget && left > budget - Duration::from_secs(1),
        "{left:?} left of {budget:?}"
    );
    assert!(!fresh.is_expired());
}
