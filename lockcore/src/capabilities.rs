//! What a backend can promise, so callers and the conformance suite need not guess.

use std::time::Duration;

use crate::LockError;
use crate::ttl::Ttl;

/// A backend's limits and guarantees, returned by
/// [`LockBackend::capabilities`](crate::LockBackend::capabilities).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Short backend name, e.g. `"redis"`.
    pub backend: &'static str,
    /// Smallest TTL the store enforces as asked.
    pub min_ttl: Duration,
    /// Largest TTL accepted.
    pub max_ttl: Duration,
    /// TTLs are rounded *up* to a multiple of this (etcd: whole seconds).
    pub ttl_granularity: Duration,
    /// Whether each lock has its own TTL or lives as long as a client session.
    pub lease_kind: LeaseKind,
    /// The order in which waiters are granted the lock.
    pub fairness: Fairness,
    /// What fencing monotonicity survives.
    pub fence_durability: FenceDurability,
    /// Whether waiters are woken by the store ([`LockBackend::watch`](crate::LockBackend::watch))
    /// rather than by polling.
    pub notifications: bool,
    /// How long after its TTL the store may still hold an abandoned lock
    /// (expiry sweeps, leader changes), plus
    /// [`expiry_slack_ttl_percent`](Self::expiry_slack_ttl_percent) of the
    /// TTL. The L1 liveness bound is TTL + [`slack_for`](Self::slack_for)(TTL).
    pub expiry_slack: Duration,
    /// The part of the slack that grows with the lease's TTL, in percent of
    /// it (etcd 3.4 restarts every lease at its full TTL after a leader
    /// change: 100; most stores: 0).
    pub expiry_slack_ttl_percent: u32,
    /// The clock the store judges expiry on, and so what can free a lock
    /// before the holder's local deadline.
    pub expiry_clock: ExpiryClock,
    /// How soon a connected holder learns it was force-released: its guard's
    /// `lost()` fires within this bound (plus one round trip). `None`: only
    /// at its next renewal (a third of the TTL by default).
    pub eviction_notice: Option<Duration>,
    /// Whether the backend implements semaphores
    /// ([`LockBackend::try_acquire`](crate::LockBackend::try_acquire) with [`LockRequest::with_permits`](crate::backend::LockRequest::with_permits)).
    pub semaphores: bool,
    /// Whether the backend implements reader-writer locks
    /// ([`LockBackend::try_acquire`](crate::LockBackend::try_acquire) with [`LockRequest::with_access`](crate::backend::LockRequest::with_access)),
    /// writer-preferring as [`RwLock`](crate::RwLock) says.
    pub rw_locks: bool,
    /// Whether the backend can raise its fence floor after a restore
    /// ([`LockBackend::raise_fence_floor`](crate::LockBackend::raise_fence_floor)).
    pub fence_floor: bool,
    /// The largest fence the store can count to (its counter's range:
    /// `i64::MAX` for a 64-bit integer, 2^53 - 1 where a script counts in
    /// doubles). A fence floor must leave room below it
    /// ([`max_fence_floor`](Self::max_fence_floor)).
    pub max_fence: u64,
    /// What a failover of the store to a replica keeps.
    pub failover: Failover,
    /// Whether the backend can set a held lease's remaining time exactly,
    /// shorter or longer, on the store's clock
    /// ([`LockBackend::set_remaining`](crate::LockBackend::set_remaining)):
    /// what a job's `at_least` needs ([`Job`](crate::Job)).
    pub sets_remaining: bool,
    /// Whether the backend takes several locks in one atomic store operation
    /// ([`LockBackend::try_acquire_each`](crate::LockBackend::try_acquire_each)):
    /// a waiting multi-lock then holds none of its names until it holds
    /// them all. Otherwise [`Locker::acquire_all`](crate::Locker::acquire_all)
    /// takes them one by one in sorted order.
    pub atomic_multi: bool,
}

/// The clock a store judges lease expiry on.
///
/// The client's local deadline is safe against clock *rates* (the drift
/// margin) but not against a clock that *steps*: where the store expires
/// leases on its host's wall clock, a forward step (NTP, an operator) frees
/// a lock before its holder's local deadline, and only fencing protects the
/// resource in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExpiryClock {
    /// The store host's wall clock (Redis `PX`, PostgreSQL
    /// `clock_timestamp()`): a forward step frees locks early.
    StoreWallClock,
    /// A monotonic lease timer on the store's leader (etcd): wall-clock steps
    /// do not move it; a leader change restarts it at the full TTL.
    StoreLeaseTimer,
    /// The client session as the server tracks it (ZooKeeper): the session
    /// timeout counted in server ticks from the client's last heartbeat.
    Session,
    /// `CLOCK_BOOTTIME` of the one host every client shares (SQLite): steps
    /// of the wall clock do not move it, suspend counts, and a reboot frees
    /// everything.
    HostBootClock,
    /// This process's monotonic clock (the in-memory backend).
    ProcessClock,
}

impl ExpiryClock {
    /// Whether a step of some wall clock can free a lock before its holder's
    /// local deadline.
    pub fn steps_with_wall_clock(self) -> bool {
        matches!(self, ExpiryClock::StoreWallClock)
    }
}

impl std::fmt::Display for ExpiryClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExpiryClock::StoreWallClock => "the store host's wall clock",
            ExpiryClock::StoreLeaseTimer => "the store leader's monotonic lease timer",
            ExpiryClock::Session => "the client session, as the server tracks it",
            ExpiryClock::HostBootClock => "the shared host's boot clock",
            ExpiryClock::ProcessClock => "this process's monotonic clock",
        })
    }
}

/// How a lease's lifetime is tied to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseKind {
    /// Each lock has its own TTL, extended by renewals.
    PerLock,
    /// Locks live as long as the client's session, whose timeout (negotiated
    /// with the server) is the effective TTL of every lease.
    Session {
        /// The negotiated session timeout.
        timeout: Duration,
    },
}

/// Waiter ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fairness {
    /// No order promised: whoever retries first after a release wins.
    None,
    /// Waiters are granted in the order they started waiting.
    Fifo,
}

/// What a failover of the store (a replica promoted after its primary
/// died) keeps: the grants clients saw, or only growing fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failover {
    /// No replica takes over: one process or file (SQLite, memory).
    None,
    /// A quorum decides every write (etcd, ZooKeeper): a new leader has
    /// every grant a client saw.
    Consensus,
    /// Synchronous replication: a grant a client saw is on a replica, so
    /// it survives one failover; no second holder appears.
    Synchronous,
    /// Asynchronous replication (or not known to be synchronous): the last
    /// grants before a failover can be lost, and a second holder granted
    /// while the first still works; fences keep growing (see
    /// [`Capabilities::fence_durability`]), and holders are told when
    /// their client reaches the promoted server.
    Asynchronous,
    /// Asynchronous, but no grant on a promoted server until this long
    /// after the failover was seen (the longest TTL in use plus slack, as
    /// configured): the old grants have run out by then, so no two holders
    /// overlap, at the cost of that long without grants.
    LockDelay(Duration),
}

/// What fencing-token monotonicity (guarantees F1/F2) survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceDurability {
    /// Survives a crash and restart of the store with its default settings.
    Durable,
    /// Survives a restart only under the stated assumption.
    Conditional(&'static str),
    /// Lives as long as the store process (the in-memory backend).
    Volatile,
}

impl Capabilities {
    /// Capabilities with neutral defaults: TTL from 1 ms to 1 year at 1 ms
    /// granularity, per-lock leases, no fairness, volatile fences, no
    /// notifications, no slack, expiry on the store's wall clock (the
    /// cautious default), no eviction notice, no way to set a lease's
    /// remaining time. Backends adjust them with the
    /// setters.
    pub fn new(backend: &'static str) -> Self {
        Capabilities {
            backend,
            min_ttl: Duration::from_millis(1),
            max_ttl: Duration::from_secs(365 * 24 * 3600),
            ttl_granularity: Duration::from_millis(1),
            lease_kind: LeaseKind::PerLock,
            fairness: Fairness::None,
            fence_durability: FenceDurability::Volatile,
            notifications: false,
            expiry_slack: Duration::ZERO,
            expiry_slack_ttl_percent: 0,
            expiry_clock: ExpiryClock::StoreWallClock,
            eviction_notice: None,
            semaphores: false,
            rw_locks: false,
            fence_floor: false,
            max_fence: i64::MAX as u64,
            failover: Failover::None,
            sets_remaining: false,
            atomic_multi: false,
        }
    }

    /// Declares [`set_remaining`](crate::LockBackend::set_remaining) support.
    pub fn sets_remaining(mut self, yes: bool) -> Self {
        self.sets_remaining = yes;
        self
    }

    /// Declares atomic multi-lock attempts.
    pub fn atomic_multi(mut self, yes: bool) -> Self {
        self.atomic_multi = yes;
        self
    }

    /// Sets what a failover keeps.
    pub fn failover(mut self, failover: Failover) -> Self {
        self.failover = failover;
        self
    }

    /// How many more grants a fence floor must leave room for below
    /// [`max_fence`](Self::max_fence): 2^32.
    pub const FENCE_FLOOR_HEADROOM: u64 = 1 << 32;

    /// Sets the largest fence the store can count to.
    pub fn max_fence(mut self, max: u64) -> Self {
        self.max_fence = max;
        self
    }

    /// The largest fence floor this store accepts: one that leaves room for
    /// [`FENCE_FLOOR_HEADROOM`](Self::FENCE_FLOOR_HEADROOM) more grants.
    pub fn max_fence_floor(&self) -> u64 {
        self.max_fence.saturating_sub(Self::FENCE_FLOOR_HEADROOM)
    }

    /// Refuses, before any I/O, a fence floor the store could not count
    /// past: every later grant would fail for ever.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the largest floor accepted.
    pub fn check_fence_floor(&self, floor: crate::FencingToken) -> Result<(), LockError> {
        let max = self.max_fence_floor();
        if floor.get() > max {
            return Err(LockError::config(format!(
                "fence floor {floor} leaves no room to count: {} counts fences up to {}, so a floor may be at most {max} (room for {} more grants)",
                self.backend,
                self.max_fence,
                Self::FENCE_FLOOR_HEADROOM
            )));
        }
        Ok(())
    }

    /// Declares semaphore support.
    pub fn semaphores(mut self, yes: bool) -> Self {
        self.semaphores = yes;
        self
    }

    /// Declares reader-writer lock support.
    pub fn rw_locks(mut self, yes: bool) -> Self {
        self.rw_locks = yes;
        self
    }

    /// Declares fence-floor support.
    pub fn fence_floor(mut self, yes: bool) -> Self {
        self.fence_floor = yes;
        self
    }

    /// Sets the expiry clock.
    pub fn expiry_clock(mut self, clock: ExpiryClock) -> Self {
        self.expiry_clock = clock;
        self
    }

    /// Sets the eviction-notice bound.
    pub fn eviction_notice(mut self, within: Option<Duration>) -> Self {
        self.eviction_notice = within;
        self
    }

    /// Sets the accepted TTL range.
    pub fn ttl_range(mut self, min: Duration, max: Duration) -> Self {
        self.min_ttl = min;
        self.max_ttl = max;
        self
    }

    /// Sets the TTL granularity.
    pub fn ttl_granularity(mut self, granularity: Duration) -> Self {
        self.ttl_granularity = granularity;
        self
    }

    /// Sets the lease kind.
    pub fn lease_kind(mut self, kind: LeaseKind) -> Self {
        self.lease_kind = kind;
        self
    }

    /// Sets the fairness.
    pub fn fairness(mut self, fairness: Fairness) -> Self {
        self.fairness = fairness;
        self
    }

    /// Sets the fence durability.
    pub fn fence_durability(mut self, durability: FenceDurability) -> Self {
        self.fence_durability = durability;
        self
    }

    /// Sets whether the store wakes waiters.
    pub fn notifications(mut self, yes: bool) -> Self {
        self.notifications = yes;
        self
    }

    /// Sets the fixed part of the expiry slack.
    pub fn expiry_slack(mut self, slack: Duration) -> Self {
        self.expiry_slack = slack;
        self
    }

    /// Sets the part of the expiry slack that grows with the TTL, in percent
    /// of it.
    pub fn expiry_slack_ttl_percent(mut self, percent: u32) -> Self {
        self.expiry_slack_ttl_percent = percent;
        self
    }

    /// How long after its TTL `ttl` an abandoned lock may still be held:
    /// the fixed slack plus the part that grows with the TTL.
    pub fn slack_for(&self, ttl: Duration) -> Duration {
        let grows = ttl
            .checked_mul(self.expiry_slack_ttl_percent)
            .map_or(Duration::MAX, |d| d / 100);
        self.expiry_slack.saturating_add(grows)
    }

    /// The TTL the store will enforce for a request of `requested`: rounded up
    /// to the granularity (session leases: the session timeout).
    ///
    /// # Errors
    /// [`LockError::InvalidTtl`] when `requested` is zero, or the effective TTL
    /// is outside `min_ttl..=max_ttl`. Nothing is ever silently clamped.
    pub fn effective_ttl(&self, requested: Duration) -> Result<Ttl, LockError> {
        let invalid = |reason: String| LockError::InvalidTtl {
            ttl: requested,
            reason,
        };
        if requested.is_zero() {
            return Err(invalid("a TTL must be positive".into()));
        }
        if requested > self.max_ttl {
            return Err(invalid(format!(
                "{} accepts TTLs up to {:?}",
                self.backend, self.max_ttl
            )));
        }
        let effective = match self.lease_kind {
            LeaseKind::Session { timeout } => timeout,
            LeaseKind::PerLock => round_up(requested, self.ttl_granularity),
        };
        if effective < self.min_ttl || requested < self.min_ttl {
            return Err(invalid(format!(
                "{} enforces TTLs of at least {:?}",
                self.backend, self.min_ttl
            )));
        }
        if effective > self.max_ttl {
            return Err(invalid(format!(
                "{} accepts TTLs up to {:?}",
                self.backend, self.max_ttl
            )));
        }
        Ok(Ttl::checked(effective))
    }
}

impl Capabilities {
    /// The remaining time [`set_remaining`](crate::LockBackend::set_remaining)
    /// sets for a request of `requested`: validated and rounded up like a
    /// per-lock TTL, whatever the [`lease_kind`](Self::lease_kind). A lease
    /// whose remaining time is set is kept by the store for that long, on
    /// its own: a session's leases included (ZooKeeper keeps it as a TTL
    /// node), so it is not the session timeout that
    /// [`effective_ttl`](Self::effective_ttl) reports for them.
    ///
    /// # Errors
    /// [`LockError::InvalidTtl`] as [`effective_ttl`](Self::effective_ttl).
    pub fn effective_remaining(&self, requested: Duration) -> Result<Ttl, LockError> {
        Capabilities {
            lease_kind: LeaseKind::PerLock,
            ..self.clone()
        }
        .effective_ttl(requested)
    }
}

fn round_up(d: Duration, granularity: Duration) -> Duration {
    let g = granularity.as_nanos().max(1);
    let n = d.as_nanos().div_ceil(g) * g;
    u64::try_from(n)
        .map(Duration::from_nanos)
        .unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_and_rejects_out_of_range() {
        let caps = Capabilities::new("etcd")
            .ttl_range(Duration::from_secs(2), Duration::from_secs(100))
            .ttl_granularity(Duration::from_secs(1));
        assert_eq!(
            caps.effective_ttl(Duration::from_millis(2500))
                .unwrap()
                .get(),
            Duration::from_secs(3)
        );
        assert_eq!(
            caps.effective_ttl(Duration::from_secs(2)).unwrap().get(),
            Duration::from_secs(2)
        );
        for bad in [
            Duration::ZERO,
            Duration::from_millis(1500),
            Duration::from_secs(101),
            Duration::MAX,
        ] {
            assert!(
                matches!(caps.effective_ttl(bad), Err(LockError::InvalidTtl { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn slack_can_grow_with_the_ttl() {
        let caps = Capabilities::new("etcd")
            .expiry_slack(Duration::from_secs(2))
            .expiry_slack_ttl_percent(100);
        assert_eq!(
            caps.slack_for(Duration::from_secs(10)),
            Duration::from_secs(12)
        );
        assert_eq!(
            Capabilities::new("redis")
                .expiry_slack(Duration::from_millis(1))
                .slack_for(Duration::from_secs(3600)),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn remaining_times_are_per_lock_whatever_the_lease_kind() {
        let caps = Capabilities::new("zk")
            .lease_kind(LeaseKind::Session {
                timeout: Duration::from_secs(4),
            })
            .ttl_granularity(Duration::from_millis(10));
        assert_eq!(
            caps.effective_remaining(Duration::from_millis(12_345))
                .unwrap()
                .get(),
            Duration::from_millis(12_350)
        );
        assert!(caps.effective_remaining(Duration::ZERO).is_err());
        assert!(
            caps.effective_remaining(Duration::from_secs(366 * 24 * 3600))
                .is_err()
        );
    }

    #[test]
    fn session_leases_report_the_session_timeout() {
        let caps = Capabilities::new("zk").lease_kind(LeaseKind::Session {
            timeout: Duration::from_secs(4),
        });
        assert_eq!(
            caps.effective_ttl(Duration::from_secs(1)).unwrap().get(),
            Duration::from_secs(4)
        );
    }
}
