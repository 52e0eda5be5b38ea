//! `LockRequest`: what a backend is asked to grant.

use crate::ttl::Ttl;
use crate::{HolderLabel, LockName};

/// One request for a lock: the name, the validated TTL, and the label to
/// store with the lease. [`Locker`](crate::Locker) builds it; backends read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRequest {
    name: LockName,
    ttl: Ttl,
    label: HolderLabel,
}

impl LockRequest {
    /// A request for `name` for `ttl`, labelled with this process
    /// ([`HolderLabel::this_process`]).
    pub fn new(name: LockName, ttl: Ttl) -> Self {
        LockRequest {
            name,
            ttl,
            label: HolderLabel::this_process(),
        }
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
