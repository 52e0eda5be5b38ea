//! Exponential backoff with full jitter, for waiters that have no store
//! notification and for retrying transient store errors.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff, capped, with "full jitter": attempt `n` sleeps a
/// uniformly random time in `0..=min(max, initial * multiplier^n)`.
///
/// Full jitter spreads a crowd of waiters over the whole window instead of
/// having them retry in lockstep (see the AWS architecture blog,
/// "Exponential Backoff And Jitter").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    multiplier: f64,
}

impl Default for Backoff {
    /// 10 ms doubling up to 1 s.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(10), Duration::from_secs(1))
    }
}

impl Backoff {
    /// Backoff starting at `initial`, doubling, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            multiplier: 2.0,
        }
    }

    /// Sets the growth factor (at least 1).
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = if multiplier.is_finite() {
            multiplier.max(1.0)
        } else {
            2.0
        };
        self
    }

    /// The cap of attempt `attempt` (0-based), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.powi(attempt.min(64) as i32);
        let secs = (self.initial.as_secs_f64() * factor).min(self.max.as_secs_f64());
        Duration::from_secs_f64(secs)
    }

    /// A random delay for attempt `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_and_jitters_below_the_ceiling() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
        assert_eq!(b.ceiling(0), Duration::from_millis(10));
        assert_eq!(b.ceiling(2), Duration::from_millis(40));
        assert_eq!(b.ceiling(10), Duration::from_millis(100));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(100));
        let delays: Vec<_> = (0..200).map(|_| b.delay(5)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(100)));
        assert!(delays.iter().any(|d| *d != delays[0]), "no jitter");
    }
}
