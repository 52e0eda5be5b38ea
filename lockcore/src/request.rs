//! `LockRequest`: what a backend is asked to grant.

use std::sync::Arc;

use crate::clock::{Clock, Moment, SystemClock};
use crate::ttl::Ttl;
use crate::{HolderLabel, LockError, LockName};

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
    permits: Option<u32>,
    access: Option<Access>,
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
            permits: None,
            access: None,
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

    /// Asks for one of `permits` slots of the semaphore `name` instead of
    /// the lock `name`. Every holder of one semaphore must give the same
    /// number ([`LockError::PermitsMismatch`](crate::LockError::PermitsMismatch)
    /// otherwise); [`check_permits`](crate::backend::check_permits) bounds it.
    pub fn with_permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// The number of permits of the semaphore asked for, or `None` for the lock.
    pub fn permits(&self) -> Option<u32> {
        self.permits
    }

    /// Asks for the reader-writer lock `name` instead of the lock `name`:
    /// a read share or the write ([`Access`]).
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = Some(access);
        self
    }

    /// The access asked for on the reader-writer lock, or `None` for the
    /// lock or a semaphore.
    pub fn access(&self) -> Option<Access> {
        self.access
    }

    /// What is asked for: the lock, a semaphore's permit, or a share of a
    /// reader-writer lock.
    pub fn kind(&self) -> Kind {
        match (self.access, self.permits) {
            (Some(_), _) => Kind::ReadWrite,
            (None, None) => Kind::Lock,
            (None, Some(_)) => Kind::Semaphore,
        }
    }
}

/// How a reader-writer lock is held: shared by readers, or by one writer
/// alone. See [`RwLock`](crate::RwLock) for the rules every backend keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// A read share: held beside other readers, never beside a writer.
    Read,
    /// The write: held by no one else, reader or writer.
    Write,
}

impl Access {
    /// `"read"` or `"write"`: how stores and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }

    /// The access spelled `"read"` or `"write"` (as stores keep it).
    pub fn parse(text: &str) -> Option<Access> {
        match text {
            "read" => Some(Access::Read),
            "write" => Some(Access::Write),
            _ => None,
        }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The namespace a name is taken in: the same name may be a lock and a
/// semaphore at once, apart. More kinds may come (so backends match with a
/// wildcard and answer [`LockError::Unsupported`](crate::LockError::Unsupported)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// The lock: one holder at a time.
    Lock,
    /// A semaphore: up to its number of permits, one holder per slot.
    Semaphore,
    /// A reader-writer lock: readers share it, a writer holds it alone.
    ReadWrite,
}

impl Kind {
    /// What a backend answers for a kind it does not keep (a kind added
    /// after it was written, or semaphores where
    /// [`Capabilities::semaphores`](crate::Capabilities::semaphores) is off).
    pub fn unsupported(self, backend: &'static str) -> LockError {
        LockError::Unsupported {
            backend,
            operation: match self {
                Kind::Lock => "locks",
                Kind::Semaphore => "semaphores",
                Kind::ReadWrite => "reader-writer locks",
            },
        }
    }
}
