//! The contract every store adapter implements.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{Backoff, Capabilities, FencingToken, Holder, Lease, LockError, LockName};

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

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// This call released the lock.
    Released,
    /// The store did not hold this lease (already released, expired or taken);
    /// nothing was changed.
    NotHeld,
}

/// A future that completes when a lock name may have become free (release,
/// forced release or expiry). Registered before it is returned, so a change
/// that happens before the caller awaits it is not missed.
pub type Wakeup = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// How long and how an [`acquire`](LockBackend::acquire) waits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WaitPolicy {
    /// Give up after this instant.
    pub deadline: Instant,
    /// Delays between attempts when the store does not notify (or failed).
    pub backoff: Backoff,
    /// With notifications, re-check at least this often anyway, so a lost
    /// notification costs latency, never liveness.
    pub recheck: Duration,
}

impl WaitPolicy {
    /// Wait until `deadline` with default backoff and a 1 s re-check.
    pub fn new(deadline: Instant) -> Self {
        WaitPolicy {
            deadline,
            backoff: Backoff::default(),
            recheck: Duration::from_secs(1),
        }
    }

    /// Sets the backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets the re-check interval.
    pub fn recheck(mut self, recheck: Duration) -> Self {
        self.recheck = recheck;
        self
    }

    /// When to try again after attempt number `attempt` (from 1) found the
    /// lock held or failed. `expires_in` is the holder's remaining TTL if
    /// the store said: expiry sends no message on most stores, so the next
    /// try comes right after it. `notified`: a store wake-up is armed and the
    /// attempt did not fail, so the wait is bounded by `recheck`; otherwise
    /// by jittered backoff. Never past the deadline.
    pub fn retry_at(
        &self,
        now: Instant,
        attempt: u32,
        expires_in: Option<Duration>,
        notified: bool,
    ) -> Instant {
        let bound = if notified {
            self.recheck
        } else {
            self.backoff.delay(attempt.saturating_sub(1))
        };
        let at_expiry = expires_in.map(|d| d + Duration::from_millis(1));
        let pause = at_expiry.map_or(bound, |d| d.min(bound));
        (now + pause).min(self.deadline)
    }
}

/// A lock store. Implement this to add a backend; users hold a
/// [`Locker`](crate::Locker) instead of calling it directly.
///
/// # Contract
///
/// Every implementation gives guarantees S1–S4, F1–F2, L1 and C1 of
/// `docs/contract.md`, which the `lock-conformance` suite checks:
///
/// - `try_acquire` is **one atomic store operation** (never check-then-set)
///   and hands out a fencing token strictly greater than every token handed
///   out for this name before it started, across store restarts where
///   [`Capabilities::fence_durability`] says so.
/// - `renew` and `release` act only if the store still holds this lease's
///   owner token (and fence), compared and changed in one atomic step; a
///   retried call after a lost reply is harmless.
/// - Expiry is judged on the store's clock, never the client's, and
///   [`Capabilities::expiry_clock`] says which clock that is.
/// - TTLs are validated with [`Capabilities::effective_ttl`] before any I/O,
///   and the lease reports the TTL the store really enforces.
/// - Nothing panics on any input.
///
/// The trait is object safe: `Arc<dyn LockBackend>` is what
/// [`Locker`](crate::Locker) holds.
#[async_trait]
pub trait LockBackend: Send + Sync + Debug + 'static {
    /// Limits and guarantees of this backend (cheap, no I/O).
    fn capabilities(&self) -> Capabilities;

    /// One attempt to take `name` for `ttl`.
    ///
    /// # Errors
    /// [`LockError::InvalidTtl`] before any I/O; [`LockError::Unavailable`] or
    /// [`LockError::Store`] when the store fails. A store error never reports
    /// success; an acquisition whose reply was lost expires after its TTL.
    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Attempt, LockError>;

    /// Extends `lease` by its TTL, keeping its fencing token.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] once the lease expired, was released or taken;
    /// it is never re-created.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError>;

    /// Releases `lease` if, and only if, the store still holds it for its owner.
    /// Idempotent: a second call reports [`ReleaseOutcome::NotHeld`].
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError>;

    /// The current holder of `name`, if any.
    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError>;

    /// Administrative eviction, in one atomic store operation: frees `name`
    /// whoever holds it (with `expected`, only if the holder's fence is that
    /// one), makes sure the next grant gets a larger fencing token, and tells
    /// a connected holder where the store can push it
    /// ([`Capabilities::eviction_notice`]). Returns the evicted holder, or
    /// `None` when nothing was evicted.
    ///
    /// Applications call [`Locker::force_release`](crate::Locker::force_release)
    /// (or [`admin::force_release`](crate::admin::force_release)), which
    /// audits the action; implementations do not emit audit events.
    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError>;

    /// Starts listening for a change of `name` and returns a future that
    /// completes when the name may have become free.
    ///
    /// The default returns `None`: no store notifications, waiters fall back
    /// to jittered backoff. Backends with notifications (pub/sub,
    /// LISTEN/NOTIFY, watches) override it and set
    /// [`Capabilities::notifications`].
    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let _ = name;
        Ok(None)
    }

    /// Waits until `name` is acquired or `wait.deadline` passes (`Ok(None)`).
    ///
    /// The default loops [`try_acquire`](Self::try_acquire), sleeping on
    /// [`watch`](Self::watch) (bounded by `wait.recheck` and the holder's
    /// remaining TTL) or on jittered backoff. Stores that keep a line
    /// (ZooKeeper, etcd, the Redis and PostgreSQL adapters) override it to
    /// wait in it.
    ///
    /// # Cancel safety
    /// Dropping the future stops waiting. If an attempt was in flight, the
    /// store may have granted it; that grant expires after one TTL.
    /// Overrides must remove any queue entry they created when dropped.
    async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        acquire_loop(self, name, ttl, wait).await
    }
}

/// The default waiting loop of [`LockBackend::acquire`], public so overrides
/// can fall back to it.
pub async fn acquire_loop<B: LockBackend + ?Sized>(
    backend: &B,
    name: &LockName,
    ttl: Duration,
    wait: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let notifications = backend.capabilities().notifications;
    let mut attempt: u32 = 0;
    loop {
        let wakeup = if notifications {
            match backend.watch(name).await {
                Ok(wakeup) => wakeup,
                Err(e) if e.is_retryable() => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        attempt = attempt.saturating_add(1);
        tracing::Span::current().record("attempts", attempt);
        let (expires_in, failed) = match backend.try_acquire(name, ttl).await {
            Ok(Attempt::Acquired(lease)) => return Ok(Some(lease)),
            Ok(Attempt::Held { expires_in }) => (expires_in, None),
            Err(e) if e.is_retryable() => {
                tracing::debug!(name = %name, attempt, error = %e, "acquire attempt failed, will retry");
                (None, Some(e))
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        if now >= wait.deadline {
            return failed.map_or(Ok(None), Err);
        }
        let until = wait.retry_at(
            now,
            attempt,
            expires_in,
            wakeup.is_some() && failed.is_none(),
        );
        match wakeup {
            Some(wakeup) => {
                tokio::select! {
                    _ = wakeup => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
            None => tokio::time::sleep_until(until).await,
        }
    }
}

macro_rules! forward_backend {
    ($($ptr:ident),*) => {$(
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<T: LockBackend + ?Sized> LockBackend for $ptr<T> {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Attempt, LockError> {
                (**self).try_acquire(name, ttl).await
            }
            async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
                (**self).renew(lease).await
            }
            async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
                (**self).release(lease).await
            }
            async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
                (**self).inspect(name).await
            }
            async fn evict(&self, name: &LockName, expected: Option<FencingToken>) -> Result<Option<Holder>, LockError> {
                (**self).evict(name, expected).await
            }
            async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
                (**self).watch(name).await
            }
            async fn acquire(&self, name: &LockName, ttl: Duration, wait: &WaitPolicy) -> Result<Option<Lease>, LockError> {
                (**self).acquire(name, ttl, wait).await
            }
        }
    )*};
}

forward_backend!(Arc, Box);
