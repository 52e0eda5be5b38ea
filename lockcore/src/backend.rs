//! What a backend author needs: the [`LockBackend`] contract and the kit to
//! implement it (requests, leases, validated TTLs, clocks, the wait loop).
//! Applications use [`Locker`](crate::Locker) and the crate root instead.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

pub use async_trait::async_trait;
pub use tokio_util::sync::CancellationToken;

pub use crate::cleanups::Cleanups;
pub use crate::clock::{Clock, Moment, SystemClock};
pub use crate::era::Era;
pub use crate::error::{BoxError, SharedError};
pub use crate::request::{Kind, LockRequest};
pub use crate::store_url::{Host, StoreUrl, parse_duration};
#[allow(deprecated)]
pub use crate::support::retry_in_background;
pub use crate::support::{check_each, check_permits, redact_url, timed};
pub use crate::ttl::Ttl;

pub mod wait;

use crate::outcome::{Attempt, AttemptEach, ReleaseOutcome};
use crate::{Capabilities, FencingToken, Holder, Lease, LockError, LockName};
use wait::{WaitPolicy, Waiter, Wakeup};

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

    /// One attempt to take `request.name()` for `request.ttl()`, storing
    /// `request.label()` with the lease: the lock, or, when the request asks
    /// for [`permits`](LockRequest::permits), one of that many slots of the
    /// semaphore of that name (a namespace apart from locks; the lease names
    /// its slot, [`Lease::slot`], and its fence is larger than every fence
    /// handed out for that slot before), or, when the request asks for an
    /// [`access`](LockRequest::access), a read share or the write of the
    /// reader-writer lock of that name (another namespace; its fence is
    /// larger than every fence of that reader-writer lock before, read or
    /// write; the rules are [`RwLock`](crate::RwLock)'s). A waiting writer's
    /// intent is left by [`acquire`](Self::acquire), never by `try_acquire`.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Store`] when the store
    /// fails. A store error never reports success; an acquisition whose reply
    /// was lost must not block the name longer than its TTL (remove it, owner
    /// checked, when the link heals). [`LockError::PermitsMismatch`] when the
    /// store keeps this semaphore with another number of permits;
    /// [`LockError::Unsupported`] for a [`Kind`] the backend does not keep
    /// (see [`Capabilities::semaphores`]).
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError>;

    /// Extends each lease by its TTL, keeping its fencing token, in as few
    /// store round trips as the store allows (one script, one statement, one
    /// shared keep-alive). One result per lease, in order, each owner- and
    /// fence-checked on its own: [`LockError::NotHeld`] once a lease expired,
    /// was released or taken; it is never re-created.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>>;

    /// Releases `lease` if, and only if, the store still holds it for its owner.
    /// Idempotent: a second call reports [`ReleaseOutcome::NotHeld`].
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError>;

    /// Who holds `name` as `kind`: the lock's holder (none or one), one
    /// holder per taken slot of the semaphore, or every reader (or the
    /// writer) of the reader-writer lock, each with its
    /// [`access`](Holder::access).
    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError>;

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

    /// Extends `lease` by its TTL: [`renew_many`](Self::renew_many) of one.
    /// Override only where one lease has a cheaper path than a batch of one.
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let answer = self.renew_many(std::slice::from_ref(lease)).await;
        answer.into_iter().next().unwrap_or_else(|| {
            Err(LockError::store(
                self.capabilities().backend,
                "renew_many answered no result for one lease",
            ))
        })
    }

    /// Sets `lease`'s remaining time to exactly `remaining` from when the
    /// store handles the call, on the store's clock: shorter or longer than
    /// what is left, keeping its fencing token. Owner- and fence-checked in
    /// one atomic step like a renewal: [`LockError::NotHeld`] once the lease
    /// expired, was released or taken; it is never re-created. From then
    /// on only that expiry frees the name (or a release, an eviction): on a
    /// store that frees a dead holder's locks early (SQLite's presence
    /// files) the lease no longer depends on this process staying alive.
    ///
    /// What [`LockGuard::release_no_sooner_than`](crate::LockGuard::release_no_sooner_than)
    /// and a job's `at_least` ([`Job`](crate::Job)) are made of. Returns the
    /// lease with `remaining` as its TTL, stamped with the send time like a
    /// renewal. Callers validate `remaining` with
    /// [`Capabilities::effective_remaining`] (a per-lock TTL even where
    /// leases are sessions).
    ///
    /// The default: [`LockError::Unsupported`]; backends that implement it
    /// set [`Capabilities::sets_remaining`].
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        let _ = (lease, remaining);
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "set_remaining",
        })
    }

    /// Starts listening for a change of `name` (as `kind`) and returns a
    /// future that completes when the name, or a slot, may have become free.
    ///
    /// The default returns `None`: no store notifications, waiters fall back
    /// to jittered backoff. Backends with notifications (pub/sub,
    /// LISTEN/NOTIFY, watches) override it and set
    /// [`Capabilities::notifications`].
    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        let _ = (name, kind);
        Ok(None)
    }

    /// Waits until the request is granted or `wait.deadline` passes (`Ok(None)`).
    ///
    /// The default runs [`wait::wait`](wait::wait) with
    /// [`Polling`]: [`watch`](Self::watch) (when
    /// notifications are declared) then [`try_acquire`](Self::try_acquire),
    /// retrying at the holder's expiry, on the wake-up, or on jittered
    /// backoff. Stores that keep a line override it with their own
    /// [`Waiter`], never with their own loop; so do backends with
    /// reader-writer locks, to keep a waiting writer's intent in the store
    /// for as long as it waits.
    ///
    /// # Cancel safety
    /// Dropping the future stops waiting. If an attempt was in flight, the
    /// store may have granted it; that grant expires after one TTL.
    /// Overrides must remove any queue entry they created when dropped.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        wait::wait(wait, &mut Polling::new(self, request)).await
    }

    /// One attempt at every lock of `requests` (locks only, distinct names
    /// in sorted order, as [`Locker::acquire_all`](crate::Locker::acquire_all)
    /// asks), in **one atomic store operation**: every lease, in order, or
    /// none taken and [`AttemptEach::Held`] naming a name found held. Each
    /// grant is what [`try_acquire`](Self::try_acquire) of that request would
    /// give (its fence, TTL, label); a lost reply is undone like a lock's.
    ///
    /// The default: [`LockError::Unsupported`]; backends that implement it
    /// set [`Capabilities::atomic_multi`], and [`Locker`](crate::Locker)
    /// then waits for a multi-lock holding none of its names, retrying this
    /// attempt on the wake-up of any of them.
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        let _ = requests;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "try_acquire_each",
        })
    }

    /// Makes every fence handed out from now on, for every name and slot,
    /// larger than `floor`: the step an operator takes after restoring the
    /// store from a backup, which may have moved fence counters back. Never
    /// lowers anything. Implementations refuse a floor the store could not
    /// count past with [`Capabilities::check_fence_floor`] before any I/O.
    ///
    /// The default: [`LockError::Unsupported`]; backends that implement it
    /// set [`Capabilities::fence_floor`].
    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let _ = floor;
        Err(LockError::Unsupported {
            backend: self.capabilities().backend,
            operation: "raise_fence_floor",
        })
    }

    /// Closes this client, and returns once it is closed:
    ///
    /// 1. every lease it granted that is still held is lost: its loss
    ///    signal ([`Lease::with_loss_signal`]) fires, so no guard answers
    ///    "held" once another client may take the name;
    /// 2. the clean-ups it owes the store (undoing an acquire whose reply
    ///    was lost, leaving a line) are finished, through its [`Cleanups`];
    /// 3. its connections, sessions, watches and files are closed.
    ///
    /// Later calls fail with [`LockError::Unavailable`]. Whether the names
    /// it held are free at once depends on the store (a closed session or
    /// presence file frees them; a per-lock TTL runs out): release guards
    /// first, or use [`Locker::close`](crate::Locker::close), which does.
    /// Idempotent.
    ///
    /// The default does nothing: for a backend that holds no connection,
    /// file or background work.
    async fn close(&self) -> Result<(), LockError> {
        Ok(())
    }
}

/// The plain waiter: arm [`watch`](LockBackend::watch) when the backend
/// declares notifications, then [`try_acquire`](LockBackend::try_acquire).
/// What [`LockBackend::acquire`] does by default, for locks and permits alike.
#[derive(Debug)]
pub struct Polling<'a, B: ?Sized> {
    backend: &'a B,
    request: &'a LockRequest,
    notifications: bool,
}

impl<'a, B: LockBackend + ?Sized> Polling<'a, B> {
    /// A waiter for `request` on `backend`.
    pub fn new(backend: &'a B, request: &'a LockRequest) -> Self {
        Polling {
            notifications: backend.capabilities().notifications,
            backend,
            request,
        }
    }
}

#[async_trait]
impl<B: LockBackend + ?Sized> Waiter for Polling<'_, B> {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        if self.notifications {
            self.backend
                .watch(self.request.name(), self.request.kind())
                .await
        } else {
            Ok(None)
        }
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        self.backend.try_acquire(self.request).await
    }
}

/// Conveniences over any backend, for tools and tests. Implemented for every
/// [`LockBackend`]; implementers never write them.
#[async_trait]
pub trait LockBackendExt: LockBackend {
    /// [`try_acquire`](LockBackend::try_acquire) of `name` for a requested
    /// `ttl`, validated with this backend's capabilities and labelled with
    /// this process.
    ///
    /// # Errors
    /// [`LockError::InvalidTtl`] before any I/O; as `try_acquire`.
    async fn try_acquire_for(&self, name: &LockName, ttl: Duration) -> Result<Attempt, LockError> {
        let ttl = self.capabilities().effective_ttl(ttl)?;
        self.try_acquire(&LockRequest::new(name.clone(), ttl)).await
    }

    /// [`acquire`](LockBackend::acquire) of `name` for a requested `ttl`.
    ///
    /// # Errors
    /// As [`try_acquire_for`](Self::try_acquire_for) and `acquire`.
    async fn acquire_for(
        &self,
        name: &LockName,
        ttl: Duration,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let ttl = self.capabilities().effective_ttl(ttl)?;
        self.acquire(&LockRequest::new(name.clone(), ttl), wait)
            .await
    }

    /// The holder of the lock `name`, if any: [`holders`](LockBackend::holders)
    /// with [`Kind::Lock`].
    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        Ok(self.holders(name, Kind::Lock).await?.into_iter().next())
    }

    /// The holders of the semaphore `name`, one per taken slot.
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        self.holders(name, Kind::Semaphore).await
    }

    /// [`try_acquire`](LockBackend::try_acquire) of one of `permits` slots.
    async fn try_acquire_permit(
        &self,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        self.try_acquire(&request.clone().with_permits(permits))
            .await
    }

    /// [`acquire`](LockBackend::acquire) of one of `permits` slots.
    async fn acquire_permit(
        &self,
        request: &LockRequest,
        permits: u32,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.acquire(&request.clone().with_permits(permits), wait)
            .await
    }
}

impl<T: LockBackend + ?Sized> LockBackendExt for T {}

macro_rules! forward_backend {
    ($($ptr:ident),*) => {$(
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<T: LockBackend + ?Sized> LockBackend for $ptr<T> {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
                (**self).try_acquire(request).await
            }
            async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
                (**self).renew_many(leases).await
            }
            async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
                (**self).release(lease).await
            }
            async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
                (**self).holders(name, kind).await
            }
            async fn evict(&self, name: &LockName, expected: Option<FencingToken>) -> Result<Option<Holder>, LockError> {
                (**self).evict(name, expected).await
            }
            async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
                (**self).renew(lease).await
            }
            async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
                (**self).set_remaining(lease, remaining).await
            }
            async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
                (**self).watch(name, kind).await
            }
            async fn acquire(&self, request: &LockRequest, wait: &WaitPolicy) -> Result<Option<Lease>, LockError> {
                (**self).acquire(request, wait).await
            }
            async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
                (**self).try_acquire_each(requests).await
            }
            async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
                (**self).raise_fence_floor(floor).await
            }
            async fn close(&self) -> Result<(), LockError> {
                (**self).close().await
            }
        }
    )*};
}

forward_backend!(Arc, Box);
