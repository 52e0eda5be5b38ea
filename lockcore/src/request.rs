//! `LockRequest`: what a backend is asked to grant.

use std::sync::Arc;

use crate::clock::{Clock, Moment, SystemClock};
use crate::ttl::Ttl;
use crate::{HolderLabel, LockName};

/// One request for a lock: the name, the validated TTL, the label to store
/// with the lease, and the clock its lease is judged on.
/// [`Locker`](crate::Locker) builds it; backends read it.
///
/// A backend stamps the lease it grants with [`now`](Self::now), read
/// *before* the request leaves (both clocks of a [`Moment`] at once), and
/// builds it with [`Lease::granted`](crate::Lease::granted), so the guard
/// judges the lease on the very clock it was stamped with.
#[derive(Debug, Clone)]
pub struct LockRequest {
    name: LockName,
    ttl: Ttl,
    label: HolderLabel,
    clock: Arc<dyn Clock>,
}

impl LockRequest {
    /// A request for `name` for `ttl`, labelled with this process
    /// ([`HolderLabel::this_process`]).
    pub fn new(name: LockName, ttl: Ttl) -> Self {
        LockRequest {
            name,
            ttl,
            label: HolderLabel::this_process(),
            clock: Arc::new(SystemClock),
        }
    }

    /// Sets the clock the lease is stamped with and judged on (the
    /// [`Locker`](crate::Locker)'s: the system clocks unless a test injects one).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock the lease is stamped with and judged on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The clocks now, on this request's clock: read it before sending.
    pub fn now(&self) -> Moment {
        self.clock.now()
    }

    /// Sets the label stored with the lease.
    pub fn with_label(mut self, label: HolderLabel) -> Self {
        self.label = label;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The TTL the store will enforce.
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// The label to store with the lease.
    pub fn label(&self) -> &HolderLabel {
        &self.label
    }
}

/// What a locker takes: a lock, or one of a semaphore's permits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Lock,
    Permits(u32),
}
