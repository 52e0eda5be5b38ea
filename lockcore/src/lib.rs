//! The core of [distlock](https://github.com/distlock/distlock): the lock
//! contract, the client layer and the in-memory reference backend.
//!
//! # Overview
//!
//! A distributed lock lets several processes agree that only one of them does
//! something at a time. Leases make it survive crashes: a holder that dies
//! stops renewing and the store frees the name after its TTL. But a lease
//! alone cannot guarantee exclusion: a holder paused longer than its TTL (GC,
//! swap, a stopped VM) wakes up still believing it holds the lock. So every
//! grant here carries a **fencing token** that only ever grows, and the
//! protected resource refuses writes carrying a token older than the newest it
//! has seen. The late holder's write is refused instead of corrupting data.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use lockcore::{FencedResource, Locker, MemoryBackend};
//!
//! let locker = Locker::new(MemoryBackend::new()).ttl(Duration::from_secs(5));
//! let stock = FencedResource::new(3_u32);
//!
//! let guard = locker.acquire("sku-42").await?;
//! if guard.is_held() {
//!     stock.write(guard.fencing_token(), |units| *units -= 1)?;
//! }
//! guard.release().await?;
//! assert_eq!(stock.read(), 2);
//! # Ok(()) }
//! ```
//!
//! # Pieces
//!
//! - [`LockName`], [`OwnerToken`], [`FencingToken`], [`Lease`], [`Holder`]: the words.
//! - [`LockBackend`]: the contract a store adapter implements (single-shot
//!   acquire, owner-checked renew and release, inspect, forced release,
//!   change notifications) and [`Capabilities`], what it promises.
//! - [`Locker`] and [`LockGuard`]: what applications hold. Waiting with
//!   notifications or jittered [`Backoff`], background renewal (one renewer
//!   per locker, batching every due lease into one
//!   [`renew_many`](LockBackend::renew_many)), the
//!   [`lost`](LockGuard::lost) signal, [`with_lock`](Locker::with_lock),
//!   hold caps ([`Locker::max_hold`]) and holder labels ([`HolderLabel`]).
//! - [`Job`] ([`Locker::job`]): a scheduled task that runs on one node
//!   only, skipped while held, kept taken for `at_least` after its grant on
//!   the store's clock, fenced with its execution id.
//! - [`MultiGuard`] ([`Locker::acquire_all`]): several names held together,
//!   all or none, one fence per name, taken in sorted order so callers
//!   never deadlock, lost with any member.
//! - [`Semaphore`] ([`Locker::semaphore`]): at most N holders, each in a slot
//!   with its own fences; [`Election`] ([`Locker::election`]): one leader at
//!   a time, with fenced terms, and [`Observer`]s.
//! - [`LockError`]: one error type; [`LockError::is_retryable`] says whether to retry.
//! - [`MemoryBackend`]: the reference backend; [`FencedResource`] and
//!   [`FencedSlots`]: the reference fenced resources, whose writes return
//!   [`Fenced`] like every adapter's fenced write.
//! - [`admin`] and [`audit`]: forced release, the fence floor after a
//!   restore, and their audit trail.
//! - [`metrics`]: the metrics every backend emits (feature `metrics`).
//! - [`backend`]: what a backend author needs besides [`LockBackend`]
//!   (requests, validated TTLs, clocks, the wait loop).
//! - `testing` (feature `testing`): a store with faults on demand and a
//!   recording fenced resource, for testing the code that uses locks.
//!
//! # Guarantees
//!
//! Every backend gives, and the `lock-conformance` suite checks:
//! S1 mutual exclusion (one atomic store operation per acquire), S2
//! owner-checked release and renew, S3 expiry on the store's clock, never
//! before the holder's local deadline unless that clock is the store host's
//! wall clock and steps forward ([`Capabilities::expiry_clock`]), S4 renewal
//! keeps the fencing token and never resurrects, F1 fencing tokens strictly
//! increase per name, F2 they keep increasing across store restarts (or
//! [`Capabilities::fence_durability`] names the assumption), L1 a crashed
//! holder blocks a name for at most TTL +
//! [`Capabilities::slack_for`]`(TTL)`, C1 a cancelled acquire leaves nothing
//! behind. Between a forced release and the holder's `lost()` (at most
//! [`Capabilities::eviction_notice`] plus a round trip for a connected
//! holder), only fencing protects the resource.
//!
//! # Implementing a backend
//!
//! Implement [`LockBackend`], then run the whole conformance suite against
//! your store with one line in `tests/`:
//! `lock_conformance::suite!(lock_conformance::shared(MyBackend::new()), expect_skips = [..]);`
//! (or any factory that hands out independent clients). `expect_skips`
//! lists the cases your backend cannot run; any other skip fails its test,
//! and so does a listed case that passes.

#![doc(test(attr(deny(warnings))))]

pub mod admin;
pub mod audit;
pub mod backend;
mod backoff;
mod capabilities;
mod cleanups;
mod clock;
mod election;
mod era;
mod error;
mod fenced;
mod fenced_rw;
mod guard;
mod job;
mod label;
mod lease;
mod local_line;
mod locker;
mod memory;
pub mod metrics;
mod multi;
mod name;
mod outcome;
mod renewer;
mod request;
mod rw_lock;
mod semaphore;
mod store_url;
mod support;
mod take_all;
#[cfg(feature = "testing")]
pub mod testing;
mod token;
mod ttl;

pub use backend::LockBackend;
pub use backoff::Backoff;
pub use capabilities::{Capabilities, ExpiryClock, Failover, Fairness, FenceDurability, LeaseKind};
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{InvalidName, LockError, LossReason};
pub use fenced::{Fenced, FencedResource, FencedSlots, StaleToken};
pub use fenced_rw::{FencedRwResource, StaleRead};
pub use guard::{HoldEnd, LockGuard};
pub use job::{Job, JobOutcome, JobRun, LastRun};
pub use label::HolderLabel;
pub use lease::{Holder, Lease};
pub use locker::Locker;
pub use memory::MemoryBackend;
pub use multi::MultiGuard;
pub use name::{IntoLockName, LockName};
pub use outcome::{Attempt, AttemptEach, ReleaseOutcome};
pub use request::Access;
pub use rw_lock::RwLock;
pub use semaphore::Semaphore;
pub use token::{FencingToken, OwnerToken};
