//! `Ttl`: a lease duration a backend has validated and will enforce.

use std::fmt;
use std::time::Duration;

/// A TTL as the store will enforce it: checked against the backend's range
/// and rounded to its granularity. Only
/// [`Capabilities::effective_ttl`](crate::Capabilities::effective_ttl) (and
/// [`effective_remaining`](crate::Capabilities::effective_remaining)) makes
/// one, so a backend that takes a `Ttl` never sees an unchecked duration:
/// "validated before any I/O" is a fact of the types.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// Only `Capabilities::effective_ttl` calls this.
    pub(crate) fn checked(d: Duration) -> Ttl {
        Ttl(d)
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// Whole milliseconds, rounded up (never zero: a TTL is positive).
    pub fn as_millis_ceil(self) -> u64 {
        u64::try_from(self.0.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }

    /// Whole seconds, rounded up.
    pub fn as_secs_ceil(self) -> u64 {
        self.0.as_secs() + u64::from(self.0.subsec_nanos() > 0)
    }
}

impl From<Ttl> for Duration {
    fn from(ttl: Ttl) -> Duration {
        ttl.0
    }
}

impl fmt::Debug for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ttl({:?})", self.0)
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_to_whole_units() {
        let ttl = Ttl::checked(Duration::from_micros(1_500));
        assert_eq!(ttl.as_millis_ceil(), 2);
        assert_eq!(ttl.as_secs_ceil(), 1);
        assert_eq!(Ttl::checked(Duration::from_secs(3)).as_secs_ceil(), 3);
        assert_eq!(Ttl::checked(Duration::MAX).as_millis_ceil(), u64::MAX);
    }
}
