//! Clock readings: what a `Moment` keeps, how it moves, and that the real
//! boot clock is read (it is what makes a host suspend count).

use std::time::Duration;

use lockcore::backend::{Clock, Moment, SystemClock};
use tokio::time::Instant;

#[test]
fn a_reading_keeps_its_parts_and_moves_both_clocks_forward() {
    let t0 = Instant::now();
    let reading = Moment::from_parts(t0, Some(Duration::from_secs(5)));
    assert_eq!(reading.mono(), t0);
    assert_eq!(reading.boot(), Some(Duration::from_secs(5)));
    let later = reading.after(Duration::from_secs(2));
    assert_eq!(
        later,
        Moment::from_parts(t0 + Duration::from_secs(2), Some(Duration::from_secs(7)))
    );
    assert_eq!(later.since(reading), Duration::from_secs(2));
    let no_boot = Moment::from_parts(t0, None).after(Duration::from_secs(1));
    assert_eq!(no_boot.boot(), None);
}

/// The boot clock advances at least as much as real time passes (it is
/// CLOCK_MONOTONIC plus time suspended): two readings 20 ms apart on this
/// thread differ by at least that on it, through `Moment::now` and through
/// the system clock alike.
#[cfg(target_os = "linux")]
#[test]
fn the_boot_clock_counts_real_time() {
    let pause = Duration::from_millis(20);
    for read in [Moment::now as fn() -> Moment, || SystemClock.now()] {
        let before = read();
        std::thread::sleep(pause);
        let after = read();
        let (Some(b0), Some(b1)) = (before.boot(), after.boot()) else {
            panic!("no boot clock reading on Linux");
        };
        assert!(b1 - b0 >= pause, "boot clock moved {:?}", b1 - b0);
        assert!(after.since(before) >= pause);
    }
}
