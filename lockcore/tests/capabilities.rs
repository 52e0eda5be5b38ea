//! What a backend declares, checked at the edges: the TTLs it accepts, the
//! fence floors it can count past, and which expiry clocks a wall-clock
//! step can move.

use std::time::Duration;

use lockcore::{Capabilities, ExpiryClock, FencingToken, LeaseKind, LockError};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ttl(caps: &Capabilities, requested: Duration) -> Result<Duration, LockError> {
    caps.effective_ttl(requested).map(|t| t.get())
}

#[test]
fn the_ttl_range_includes_both_ends() {
    let caps = Capabilities::new("test").ttl_range(secs(2), secs(100));
    assert_eq!(ttl(&caps, secs(2)).unwrap(), secs(2));
    assert_eq!(ttl(&caps, secs(100)).unwrap(), secs(100));
    assert!(matches!(
        ttl(&caps, secs(100) + Duration::from_nanos(1)),
        Err(LockError::InvalidTtl { .. })
    ));
}

#[test]
fn a_ttl_rounded_up_past_the_maximum_is_refused() {
    // 100.2 s asked, within the range, but the store enforces 101 s.
    let caps = Capabilities::new("test")
        .ttl_range(secs(1), Duration::from_millis(100_500))
        .ttl_granularity(secs(1));
    let err = ttl(&caps, Duration::from_millis(100_200)).unwrap_err();
    assert!(
        matches!(err, LockError::InvalidTtl { .. }) && err.to_string().contains("up to"),
        "{err}"
    );
    // Rounded up onto the maximum itself: accepted.
    let caps = caps.ttl_range(secs(1), secs(100));
    assert_eq!(
        ttl(&caps, Duration::from_millis(99_500)).unwrap(),
        secs(100)
    );
}

#[test]
fn a_session_longer_than_the_maximum_is_refused() {
    let caps = Capabilities::new("zk")
        .ttl_range(secs(1), secs(10))
        .lease_kind(LeaseKind::Session { timeout: secs(20) });
    assert!(matches!(
        ttl(&caps, secs(5)),
        Err(LockError::InvalidTtl { .. })
    ));
}

#[test]
fn a_fence_floor_must_leave_room_for_two_to_the_32_grants() {
    assert_eq!(Capabilities::FENCE_FLOOR_HEADROOM, 1_u64 << 32);
    let caps = Capabilities::new("test").max_fence((1 << 53) - 1);
    let max = (1_u64 << 53) - 1 - (1 << 32);
    assert_eq!(caps.max_fence_floor(), max);
    assert!(
        caps.check_fence_floor(FencingToken::new(max).unwrap())
            .is_ok()
    );
    assert!(
        caps.check_fence_floor(FencingToken::new(1).unwrap())
            .is_ok()
    );
    let err = caps
        .check_fence_floor(FencingToken::new(max + 1).unwrap())
        .unwrap_err();
    assert!(
        matches!(err, LockError::InvalidConfig { .. })
            && err.to_string().contains(&max.to_string()),
        "{err}"
    );
    // A store that can barely count has no room for any floor.
    assert_eq!(Capabilities::new("tiny").max_fence(5).max_fence_floor(), 0);
}

#[test]
fn only_a_store_wall_clock_steps() {
    assert!(ExpiryClock::StoreWallClock.steps_with_wall_clock());
    for clock in [
        ExpiryClock::StoreLeaseTimer,
        ExpiryClock::Session,
        ExpiryClock::HostBootClock,
        ExpiryClock::ProcessClock,
    ] {
        assert!(!clock.steps_with_wall_clock(), "{clock:?}");
    }
}
