//! Time for lease deadlines: the monotonic clock, and the clock that keeps
//! counting while the host is suspended.
//!
//! A store keeps counting a lease's TTL while the holder's host is suspended
//! (a laptop lid, a paused VM), but `CLOCK_MONOTONIC`, which tokio's
//! `Instant` reads, stops. After resume a deadline on the monotonic clock
//! alone would call the lock held for as long as the host slept, while the
//! store has long given it to someone else. So every reading also takes
//! `CLOCK_BOOTTIME` on Linux (monotonic plus time suspended), and elapsed
//! time is the larger of the two.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// One reading of the clocks a lease deadline is judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    mono: Instant,
    boot: Option<Duration>,
}

impl Moment {
    /// The clocks now.
    pub fn now() -> Moment {
        Moment {
            mono: Instant::now(),
            boot: boot_time(),
        }
    }

    /// A reading made of explicit parts: the monotonic instant and the time
    /// since boot including suspend (`None` where the platform has no such
    /// clock). For tests and for [`Clock`] implementations.
    pub fn from_parts(mono: Instant, boot: Option<Duration>) -> Moment {
        Moment { mono, boot }
    }

    /// The monotonic (tokio) instant of this reading.
    pub fn mono(&self) -> Instant {
        self.mono
    }

    /// Time since boot including suspend, where the platform has it.
    pub fn boot(&self) -> Option<Duration> {
        self.boot
    }

    /// Time from `earlier` to `self`: the larger of what the two clocks
    /// measured (zero if `earlier` is later).
    pub fn since(&self, earlier: Moment) -> Duration {
        let mono = self.mono.saturating_duration_since(earlier.mono);
        let boot = match (self.boot, earlier.boot) {
            (Some(now), Some(then)) => now.saturating_sub(then),
            _ => Duration::ZERO,
        };
        mono.max(boot)
    }

    /// This reading moved forward by `d` on both clocks.
    pub fn after(&self, d: Duration) -> Moment {
        Moment {
            mono: self.mono + d,
            boot: self.boot.map(|b| b.saturating_add(d)),
        }
    }
}

/// A source of [`Moment`]s. [`SystemClock`] reads the real clocks; tests
/// inject their own (say, one whose boot clock jumps as if the host slept).
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The clocks now.
    fn now(&self) -> Moment;
}

/// The real clocks: tokio's `Instant` and, on Linux, `CLOCK_BOOTTIME`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Moment {
        Moment::now()
    }
}

/// `CLOCK_BOOTTIME`: monotonic, and counts time spent suspended.
#[cfg(target_os = "linux")]
fn boot_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on
    // every Linux since 2.6.39 and the call has no other side effect.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(not(target_os = "linux"))]
fn boot_time() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_is_the_larger_of_the_two_clocks() {
        let t0 = Instant::now();
        let start = Moment::from_parts(t0, Some(Duration::from_secs(100)));
        // Awake: both clocks agree.
        let awake = Moment::from_parts(t0 + Duration::from_secs(2), Some(Duration::from_secs(102)));
        assert_eq!(awake.since(start), Duration::from_secs(2));
        // Suspended for 60 s: the monotonic clock stood still, the boot clock did not.
        let resumed =
            Moment::from_parts(t0 + Duration::from_secs(2), Some(Duration::from_secs(162)));
        assert_eq!(resumed.since(start), Duration::from_secs(62));
        // No boot clock: the monotonic clock alone.
        let plain = Moment::from_parts(t0 + Duration::from_secs(3), None);
        assert_eq!(plain.since(start), Duration::from_secs(3));
        assert_eq!(start.since(resumed), Duration::ZERO);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_boot_clock_is_read_on_linux() {
        let a = Moment::now();
        let b = Moment::now();
        assert!(a.boot().is_some() && b.boot() >= a.boot());
    }
}
