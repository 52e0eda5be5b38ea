//! The clock leases expire on: `CLOCK_BOOTTIME` of the host every client
//! shares, tagged with the kernel's boot id.
//!
//! Every process of one host reads the same `CLOCK_BOOTTIME`: it never
//! steps with the wall clock (NTP, an operator) and counts time suspended.
//! It restarts at zero on every boot, so each lease row also keeps the boot
//! it was written in: a row of an earlier boot is expired, its holder died
//! with that boot. A process in a time namespace sees the boot clock moved
//! by its namespace's offset; the offset is taken back out, so every
//! namespace of one kernel agrees.

use std::time::Duration;

use lockcore::LockError;

use crate::error::BACKEND;

/// The host's boot clock as every process of it reads it.
#[derive(Debug, Clone)]
pub(crate) struct HostClock {
    boot_id: String,
    /// This process's time-namespace offset of `CLOCK_BOOTTIME`.
    offset: i128,
}

impl HostClock {
    /// Reads the boot id and this process's time-namespace offset.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] off Linux, or without `/proc`.
    pub(crate) fn new() -> Result<Self, LockError> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().to_owned())
            .ok()
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                LockError::config(
                    "lock-sqlite needs Linux: leases expire on CLOCK_BOOTTIME and the kernel's \
                     boot id (/proc/sys/kernel/random/boot_id), which this system does not have",
                )
            })?;
        let offset = std::fs::read_to_string("/proc/self/timens_offsets")
            .ok()
            .and_then(|text| boottime_offset(&text))
            .unwrap_or(0);
        let clock = HostClock { boot_id, offset };
        clock.now()?;
        Ok(clock)
    }

    /// The boot this clock counts from.
    pub(crate) fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Nanoseconds since this boot, as the host (not this namespace) counts.
    pub(crate) fn now(&self) -> Result<i64, LockError> {
        let boot = lockcore::backend::Moment::now().boot().ok_or_else(|| {
            LockError::store(BACKEND, "CLOCK_BOOTTIME cannot be read on this system")
        })?;
        i64::try_from(boot.as_nanos() as i128 - self.offset)
            .map_err(|_| LockError::store(BACKEND, "CLOCK_BOOTTIME is out of range"))
    }
}

/// `boottime SECS NANOS` from `/proc/self/timens_offsets`, in nanoseconds.
fn boottime_offset(text: &str) -> Option<i128> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("boottime"))?;
    let mut words = line.split_whitespace().skip(1);
    let secs: i128 = words.next()?.parse().ok()?;
    let nanos: i128 = words.next()?.parse().ok()?;
    Some(secs * 1_000_000_000 + nanos)
}

/// `d` in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Nanoseconds back to a duration (zero if negative).
pub(crate) fn duration(nanos: i64) -> Duration {
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_offset_of_a_time_namespace() {
        let text = "monotonic 0 0\nboottime -5 250\n";
        assert_eq!(boottime_offset(text), Some(-5_000_000_000 + 250));
        assert_eq!(boottime_offset("monotonic 1 0\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_host_clock_moves_forward_within_one_boot() {
        let clock = HostClock::new().unwrap();
        let a = clock.now().unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let b = clock.now().unwrap();
        assert!(b > a && a > 0);
        assert_eq!(clock.boot_id().len(), 36);
    }
}
