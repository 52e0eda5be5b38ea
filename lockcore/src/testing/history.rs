//! The history of a test store: every grant and what became of it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use crate::{FencingToken, Holder, HolderLabel, Lease, LockName, OwnerToken};

/// One change of a grant on the store, as [`TestStore::history`] lists it.
///
/// [`TestStore::history`]: super::TestStore::history
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// When the store made the change (tokio's clock: under a paused clock,
    /// exactly the instant the test advanced to).
    pub at: Instant,
    /// What happened.
    pub change: Change,
    /// The lock (or semaphore) name.
    pub name: LockName,
    /// The grant's fencing token.
    pub fence: FencingToken,
    /// The label the grant was asked with: who held it.
    pub label: HolderLabel,
    /// The semaphore slot (`None` for a lock).
    pub slot: Option<u32>,
}

/// What happened to a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The store granted it.
    Granted,
    /// A renewal reached the store and extended it.
    Renewed,
    /// Its holder released it.
    Released,
    /// Its TTL ran out on the store, or the test expired it
    /// ([`TestStore::expire`](super::TestStore::expire)).
    Expired,
    /// It was force-released (an operator, [`TestStore::evict`](super::TestStore::evict)).
    Evicted,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} \"{}\" fence {} to {}",
            self.change, self.name, self.fence, self.label
        )?;
        if let Some(slot) = self.slot {
            write!(f, " (slot {slot})")?;
        }
        Ok(())
    }
}

/// The record the clients of one store share. Natural expiries are not
/// events the in-memory store sees happen, so they are worked out when the
/// history is read: a grant neither released nor evicted expired one TTL
/// after its last grant or renewal, if that moment has come.
#[derive(Debug, Clone, Default)]
pub(super) struct History {
    inner: Arc<Mutex<Record>>,
}

#[derive(Debug, Default)]
struct Record {
    events: Vec<Event>,
    /// Grants not yet released, evicted or expired by the test: when the
    /// store lets each run out.
    open: HashMap<OwnerToken, Open>,
}

#[derive(Debug)]
struct Open {
    granted: Event,
    expires_at: Instant,
}

impl History {
    fn lock(&self) -> MutexGuard<'_, Record> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store granted `lease`, asked with `label`, at `at`.
    pub(super) fn granted(&self, lease: &Lease, label: &HolderLabel, at: Instant) {
        let event = Event {
            at,
            change: Change::Granted,
            name: lease.name().clone(),
            fence: lease.fence(),
            label: label.clone(),
            slot: lease.slot(),
        };
        let mut record = self.lock();
        record.events.push(event.clone());
        record.open.insert(
            lease.owner(),
            Open {
                granted: event,
                expires_at: at + lease.ttl().get(),
            },
        );
    }

    /// The store extended `lease` by its TTL at `at`.
    pub(super) fn renewed(&self, lease: &Lease, at: Instant) {
        let mut record = self.lock();
        let Some(open) = record.open.get_mut(&lease.owner()) else {
            return;
        };
        open.expires_at = at + lease.ttl().get();
        let event = open.granted.clone();
        record.events.push(Event {
            at,
            change: Change::Renewed,
            ..event
        });
    }

    /// The grant of `owner` ended with `change` at `at`.
    pub(super) fn ended(&self, owner: Option<OwnerToken>, change: Change, at: Instant) {
        let mut record = self.lock();
        if let Some(open) = owner.and_then(|owner| record.open.remove(&owner)) {
            record.events.push(Event {
                at,
                change,
                ..open.granted
            });
        }
    }

    /// The grant `holder` (as the store reported it) ended with `change`.
    pub(super) fn holder_ended(&self, holder: Option<&Holder>, change: Change, at: Instant) {
        if let Some(holder) = holder {
            self.ended(holder.owner, change, at);
        }
    }

    /// Every event up to `now`, in the order they happened. An expiry comes
    /// before what was recorded at its very instant: the store counts a
    /// lease gone at its expiry, so a grant at that instant came after it.
    pub(super) fn events(&self, now: Instant) -> Vec<Event> {
        let record = self.lock();
        let mut expired: Vec<Event> = record
            .open
            .values()
            .filter(|open| open.expires_at <= now)
            .map(|open| Event {
                at: open.expires_at,
                change: Change::Expired,
                ..open.granted.clone()
            })
            .collect();
        expired.sort_by_key(|event| event.at);
        let mut recorded = record.events.iter().cloned().peekable();
        let mut events = Vec::with_capacity(record.events.len() + expired.len());
        for expiry in expired {
            while let Some(event) = recorded.next_if(|event| event.at < expiry.at) {
                events.push(event);
            }
            events.push(expiry);
        }
        events.extend(recorded);
        events
    }
}
