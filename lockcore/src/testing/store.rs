//! `TestStore`: one in-memory store, the clients the application gets, and
//! what an operator or another process could do to it.

use std::time::Duration;

use tokio::time::Instant;

use super::client::TestBackend;
use super::faults::Faults;
use super::history::{Change, Event, History};
use crate::backend::LockRequest;
use crate::{
    Attempt, Holder, HolderLabel, IntoLockName, Lease, LockBackend, LockName, MemoryBackend,
};

/// A lock store for tests: a [`MemoryBackend`] (expiry on tokio's clock, so
/// `tokio::time::pause()` drives it) with controls a real store does not
/// give: expire or evict a name now, hold a name as another client, inject
/// [`Faults`], and read the [`history`](Self::history) of every grant.
///
/// Hand each part of the application its own [`client`](Self::client)
/// (one per process or node you model); keep the store to act on it.
/// Clones are handles to the same store.
///
/// The controls panic on invalid input (a name, label or TTL the store
/// refuses): they are for tests, where that is a bug in the test.
#[derive(Debug, Clone, Default)]
pub struct TestStore {
    /// The store's own client: what the controls act through, never
    /// faulted.
    store: MemoryBackend,
    faults: Faults,
    history: History,
}

impl TestStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new client of this store, with faults of its own
    /// ([`TestBackend::faults`]) on top of the store's. Pass it to
    /// [`Locker::new`](crate::Locker::new).
    pub fn client(&self) -> TestBackend {
        TestBackend::new(
            self.store.clone(),
            self.faults.clone(),
            self.history.clone(),
        )
    }

    /// The faults every client of this store suffers.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// The store forgets the lock `name` now, as if its TTL had run out
    /// while its holder's renewals were not getting through. The holder is
    /// not told: its next renewal is refused, and its `lost()` fires then
    /// ([`LossReason::RenewalRefused`](crate::LossReason::RenewalRefused)),
    /// at most one renew interval from now. Waiters are woken at once.
    /// Returns the holder that was expired, if there was one.
    ///
    /// # Panics
    /// On an invalid name.
    pub fn expire(&self, name: impl IntoLockName) -> Option<Holder> {
        let name = valid_name(name);
        let holder = self.store.expire_now(&name);
        self.history
            .holder_ended(holder.as_ref(), Change::Expired, Instant::now());
        holder
    }

    /// An operator force-releases the lock `name`
    /// ([`admin::force_release`](crate::admin::force_release), audited):
    /// the holder's `lost()` fires at once
    /// ([`LossReason::StoreReported`](crate::LossReason::StoreReported)),
    /// even across a partition, and the next grant gets a larger fence.
    /// Returns the evicted holder, if there was one.
    ///
    /// # Panics
    /// On an invalid name.
    pub async fn evict(&self, name: impl IntoLockName) -> Option<Holder> {
        let name = valid_name(name);
        let holder = crate::admin::force_release(&self.store, &name, "evicted by the test", None)
            .await
            .expect("the store's own client is never closed");
        self.history
            .holder_ended(holder.as_ref(), Change::Evicted, Instant::now());
        holder
    }

    /// Another client, labelled `label`, takes the lock `name` for `ttl` and
    /// never renews it: a phantom holder (a process that crashed holding the
    /// lock, another node). The name is free again once `ttl` has passed on
    /// tokio's clock, or after [`expire`](Self::expire) or
    /// [`evict`](Self::evict). Returns the phantom's lease (its fence is
    /// what a resource saw from that holder).
    ///
    /// # Panics
    /// When `name` is already held, or on an invalid name, label or TTL.
    pub async fn hold_as(&self, name: impl IntoLockName, label: &str, ttl: Duration) -> Lease {
        let name = valid_name(name);
        let label = HolderLabel::new(label).expect("a valid holder label");
        let ttl = self
            .store
            .capabilities()
            .effective_ttl(ttl)
            .expect("a valid TTL");
        let request = LockRequest::new(name.clone(), ttl).with_label(label.clone());
        let now = Instant::now();
        match self.store.try_acquire(&request).await {
            Ok(Attempt::Acquired(lease)) => {
                self.history.granted(&lease, &label, now);
                lease
            }
            Ok(Attempt::Held { .. }) => panic!("hold_as: \"{name}\" is already held"),
            Err(e) => panic!("hold_as: {e}"),
        }
    }

    /// Every grant this store made, and each renewal, release, expiry and
    /// eviction of it, in the order they happened on the store, up to now.
    pub fn history(&self) -> Vec<Event> {
        self.history.events(Instant::now())
    }
}

fn valid_name(name: impl IntoLockName) -> LockName {
    name.into_lock_name().expect("a valid lock name")
}
