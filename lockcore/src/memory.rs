//! `MemoryBackend`: the reference implementation of [`LockBackend`].
//!
//! It keeps locks in process memory, judges expiry on the tokio clock (which
//! plays the store's clock, and can be paused in tests), draws fencing tokens
//! from one counter that never goes back, and wakes waiters through a change
//! channel per name. It passes the whole conformance suite and is the default
//! backend for demos, tests and single-process programs.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{LockRequest, Wakeup};
use crate::{
    Attempt, Capabilities, ExpiryClock, FenceDurability, FencingToken, Holder, HolderLabel, Lease,
    LockBackend, LockError, LockName, OwnerToken, ReleaseOutcome,
};

const BACKEND: &str = "memory";

/// Locks in this process's memory. Clones share the same locks, so each
/// clone plays an independent client of one store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lockcore::{Locker, MemoryBackend};
///
/// let store = MemoryBackend::new();
/// let (a, b) = (Locker::new(store.clone()), Locker::new(store));
/// let guard = a.acquire("report").await?;
/// assert!(b.try_acquire("report").await?.is_none());
/// guard.release().await?;
/// assert!(b.try_acquire("report").await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    slots: HashMap<LockName, Slot>,
    /// One counter for all names: strictly increasing per name, and nothing
    /// to remember once a name is free.
    last_fence: u64,
}

struct Slot {
    holder: Option<Grant>,
    changes: watch::Sender<()>,
}

#[derive(Clone)]
struct Grant {
    owner: OwnerToken,
    fence: FencingToken,
    expires_at: Instant,
    label: HolderLabel,
    /// Cancelled on eviction: the holder's guard hears it at once.
    evicted: CancellationToken,
}

impl Grant {
    fn holder(&self, now: Instant) -> Holder {
        Holder::new(self.fence, Some(self.owner), Some(self.expires_at - now))
            .with_label(Some(self.label.clone()))
    }
}

impl Slot {
    fn live(&self, now: Instant) -> Option<&Grant> {
        self.holder.as_ref().filter(|g| g.expires_at > now)
    }

    fn holds(&self, lease: &Lease, now: Instant) -> bool {
        self.live(now)
            .is_some_and(|g| g.owner == lease.owner() && g.fence == lease.fence())
    }

    fn free(&mut self) {
        self.holder = None;
        self.changes.send_replace(());
    }
}

impl State {
    fn slot(&mut self, name: &LockName) -> &mut Slot {
        self.slots.entry(name.clone()).or_insert_with(|| Slot {
            holder: None,
            changes: watch::channel(()).0,
        })
    }

    /// Forgets free names nobody waits on, so memory stays bounded by the
    /// number of held or watched names.
    fn tidy(&mut self, name: &LockName, now: Instant) {
        if let Some(slot) = self.slots.get(name)
            && slot.live(now).is_none()
            && slot.changes.receiver_count() == 0
        {
            self.slots.remove(name);
        }
    }
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave State half-updated
        // (every update is a single assignment), so poisoning is ignored.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryBackend")
            .field("names", &state.slots.len())
            .field("last_fence", &state.last_fence)
            .finish()
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .fence_durability(FenceDurability::Volatile)
            .notifications(true)
            .expiry_clock(ExpiryClock::ProcessClock)
            .eviction_notice(Some(Duration::ZERO))
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let (name, ttl) = (request.name(), request.ttl());
        let now = Instant::now();
        let mut state = self.lock();
        if let Some(holder) = state.slot(name).live(now) {
            return Ok(Attempt::Held {
                expires_in: Some(holder.expires_at - now),
            });
        }
        state.last_fence += 1;
        let fence = FencingToken::new(state.last_fence).expect("counter starts above zero");
        let owner = OwnerToken::new();
        let evicted = CancellationToken::new();
        state.slot(name).holder = Some(Grant {
            owner,
            fence,
            expires_at: now + ttl.get(),
            label: request.label().clone(),
            evicted: evicted.clone(),
        });
        Ok(Attempt::Acquired(
            Lease::new(name.clone(), owner, fence, ttl, now).with_loss_signal(evicted),
        ))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.slots.get_mut(lease.name()) {
            Some(slot) if slot.holds(lease, now) => {
                if let Some(grant) = slot.holder.as_mut() {
                    grant.expires_at = now + lease.ttl();
                }
                Ok(lease.renewed(now))
            }
            _ => Err(LockError::NotHeld {
                name: lease.name().clone(),
            }),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let now = Instant::now();
        let mut state = self.lock();
        let outcome = match state.slots.get_mut(lease.name()) {
            Some(slot) if slot.holds(lease, now) => {
                slot.free();
                ReleaseOutcome::Released
            }
            _ => ReleaseOutcome::NotHeld,
        };
        state.tidy(lease.name(), now);
        Ok(outcome)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let now = Instant::now();
        let state = self.lock();
        Ok(state
            .slots
            .get(name)
            .and_then(|slot| slot.live(now))
            .map(|g| g.holder(now)))
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let now = Instant::now();
        let mut state = self.lock();
        let slot = state.slot(name);
        let evicted = slot
            .live(now)
            .filter(|g| expected.is_none_or(|fence| g.fence == fence))
            .cloned();
        if let Some(grant) = &evicted {
            grant.evicted.cancel();
            slot.free();
        }
        state.tidy(name, now);
        // The next grant draws from the shared counter: larger than the
        // evicted fence already.
        Ok(evicted.map(|g| g.holder(now)))
    }

    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let now = Instant::now();
        let mut state = self.lock();
        let slot = state.slot(name);
        let mut changes = slot.changes.subscribe();
        let expiry = slot.live(now).map(|g| g.expires_at);
        Ok(Some(Box::pin(async move {
            let expired = async {
                match expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changes.changed() => {}
                _ = expired => {}
            }
        })))
    }
}
