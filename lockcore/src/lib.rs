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
//!   notifications or jittered [`Backoff`], background renewal, the
//!   [`lost`](LockGuard::lost) signal, and [`with_lock`](Locker::with_lock).
//! - [`LockError`]: one error type; [`LockError::is_retryable`] says whether to retry.
//! - [`MemoryBackend`]: the reference backend; [`FencedResource`]: the
//!   reference fenced resource.
//! - [`admin`] and [`audit`]: forced release and its audit trail.
//!
//! # Guarantees
//!
//! Every backend gives, and the `lock-conformance` suite checks:
//! S1 mutual exclusion (one atomic store operation per acquire), S2
//! owner-checked release and renew, S3 expiry on the store's clock, S4 renewal
//! keeps the fencing token and never resurrects, F1 fencing tokens strictly
//! increase per name, F2 they keep increasing across store restarts (or
//! [`Capabilities::fence_durability`] names the assumption), L1 a crashed
//! holder blocks a name for at most TTL + [`Capabilities::expiry_slack`], C1 a
//! cancelled acquire leaves nothing behind.
//!
//! # Implementing a backend
//!
//! Implement [`LockBackend`], then run the whole conformance suite against
//! your store with one line in `tests/`:
//! `lock_conformance::suite!(lock_conformance::shared(MyBackend::new()));`
//! (or any factory that hands out independent clients).

#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings))))]

pub mod admin;
pub mod audit;
pub mod backend;
mod backoff;
mod capabilities;
mod clock;
mod election;
mod error;
mod fenced;
mod guard;
mod label;
mod lease;
mod local_line;
mod locker;
mod memory;
pub mod metrics;
mod name;
mod renewer;
mod request;
mod semaphore;
mod support;
mod token;
mod ttl;
pub mod wait;

pub use backend::{Attempt, LockBackend, ReleaseOutcome};
pub use backoff::Backoff;
pub use capabilities::{Capabilities, ExpiryClock, Fairness, FenceDurability, LeaseKind};
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{InvalidName, LockError, LossReason};
pub use fenced::{Fenced, FencedResource, FencedSlots, StaleToken};
pub use guard::LockGuard;
pub use label::HolderLabel;
pub use lease::{Holder, Lease};
pub use locker::Locker;
pub use memory::MemoryBackend;
pub use name::{IntoLockName, LockName};
pub use semaphore::Semaphore;
pub use token::{FencingToken, OwnerToken};
