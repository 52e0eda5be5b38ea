//! etcd leases, granted once and reused: the hot path attaches a lock to a
//! lease this client already holds, so acquiring is one `Txn`.
//!
//! Every lock gets a lease of its own (renewing one lock never extends
//! another). A lease goes back to the pool only when this client deleted the
//! lock's key itself (release or cancelled wait), so a pooled lease has no
//! key attached. Pooled leases are not kept alive in the background: a lease
//! taken from the pool counts from its last refresh (grant or keep-alive), and
//! is refreshed first when that is old.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Idle leases kept per TTL; beyond that they are left to expire.
const MAX_IDLE_PER_TTL: usize = 64;

/// A lease this client may attach one lock to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) id: i64,
    pub(crate) ttl: Duration,
    /// When the request that last (re)started the lease's TTL was sent.
    pub(crate) refreshed: Instant,
}

impl Slot {
    pub(crate) fn age(&self) -> Duration {
        self.refreshed.elapsed()
    }

    /// Young enough to use without a keep-alive first.
    pub(crate) fn fresh(&self) -> bool {
        self.age() <= self.ttl / 4
    }

    /// Old enough that it may be gone: not worth a keep-alive.
    pub(crate) fn stale(&self) -> bool {
        self.age() >= self.ttl * 3 / 4
    }
}

/// What a granted lock carries in its [`Lease`](lockcore::Lease) extension.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) lease_id: i64,
    /// Which backend instance granted it: only that one pools the lease again.
    pub(crate) pool: u64,
    /// Cancelled by `release`: stops the loss watch (see `loss`).
    pub(crate) done: lockcore::backend::CancellationToken,
}

#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: Mutex<HashMap<Duration, Vec<Slot>>>,
}

impl Pool {
    /// The most recently refreshed idle lease for `ttl`.
    pub(crate) fn take(&self, ttl: Duration) -> Option<Slot> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let slots = idle.get_mut(&ttl)?;
        let best = (0..slots.len()).max_by_key(|&i| slots[i].refreshed)?;
        Some(slots.swap_remove(best))
    }

    /// Returns a lease that has no key attached.
    pub(crate) fn give_back(&self, slot: Slot) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let slots = idle.entry(slot.ttl).or_default();
        slots.retain(|s| !s.stale() && s.id != slot.id);
        if !slot.stale() && slots.len() < MAX_IDLE_PER_TTL {
            slots.push(slot);
        }
    }

    pub(crate) fn idle(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pool_prefers_fresh_leases_and_drops_stale_ones() {
        let pool = Pool::default();
        let ttl = Duration::from_secs(4);
        let old = Slot {
            id: 1,
            ttl,
            refreshed: Instant::now(),
        };
        tokio::time::advance(Duration::from_secs(1)).await;
        let new = Slot {
            id: 2,
            ttl,
            refreshed: Instant::now(),
        };
        pool.give_back(old);
        pool.give_back(new);
        pool.give_back(new); // a second give-back of one lease is ignored
        assert_eq!(pool.idle(), 2);
        assert_eq!(pool.take(ttl).map(|s| s.id), Some(2));
        assert!(pool.take(Duration::from_secs(5)).is_none());
        tokio::time::advance(Duration::from_secs(3)).await;
        pool.give_back(new); // stale now: dropped, and the old one with it
        assert_eq!(pool.idle(), 0);
    }
}
