//! What an acquisition attempt and a release report.

use std::time::Duration;

use crate::LockName;
use crate::lease::Lease;

/// The outcome of one acquisition attempt. Contention is not an error.
#[derive(Debug)]
#[must_use = "an acquired lease must be released or left to expire"]
pub enum Attempt {
    /// The lock is ours.
    Acquired(Lease),
    /// Someone else holds it.
    Held {
        /// The holder's remaining TTL, when the store reports it cheaply, so
        /// waiters can retry right when it expires.
        expires_in: Option<Duration>,
    },
}

impl Attempt {
    /// The lease, if acquired.
    pub fn into_lease(self) -> Option<Lease> {
        match self {
            Attempt::Acquired(lease) => Some(lease),
            Attempt::Held { .. } => None,
        }
    }
}

/// The outcome of one attempt at several locks at once
/// ([`LockBackend::try_acquire_each`](crate::LockBackend::try_acquire_each)):
/// every lease, or none.
#[derive(Debug)]
#[must_use = "acquired leases must be released or left to expire"]
pub enum AttemptEach {
    /// Every lock is ours: one lease per request, in the requests' order.
    Acquired(Vec<Lease>),
    /// One of them is held by someone else; none was taken.
    Held {
        /// A name found held.
        name: LockName,
        /// Its holder's remaining TTL, when the store reports it cheaply.
        expires_in: Option<Duration>,
    },
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// This call released the lock.
    Released,
    /// The store did not hold this lease (already released, expired or taken);
    /// nothing was changed.
    NotHeld,
}
