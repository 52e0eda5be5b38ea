#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;

pub use connect::{SCHEMES, connect};

// The user API: what applications hold and handle.
pub use lockcore::{
    Access, Attempt, Backoff, Capabilities, Election, ExpiryClock, Failover, Fairness,
    FenceDurability, Fenced, FencedResource, FencedRwResource, FencedSlots, FencingToken, HoldEnd,
    Holder, HolderLabel, IntoLockName, InvalidName, Job, JobOutcome, JobRun, LastRun, Leader,
    Leadership, Lease, LeaseKind, LockBackend, LockError, LockGuard, LockName, Locker, LossReason,
    MemoryBackend, MultiGuard, Observer, OwnerToken, ReleaseOutcome, RwLock, Semaphore, StaleRead,
    StaleToken,
};
// Administrative actions, their audit trail, and the metric names.
pub use lockcore::{admin, audit, metrics};
// Testing the code that uses locks: a store with faults on demand, and a
// recording fenced resource (docs/testing-your-code.md).
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use lockcore::testing;

/// For backend authors: the kit to implement [`LockBackend`] (requests,
/// validated TTLs, clocks, the wait loop in [`backend::wait`]). The types a
/// backend returns ([`Attempt`], [`Lease`], [`Holder`], [`ReleaseOutcome`])
/// are at the crate root, where applications meet them too. Run the
/// `lock-conformance` suite against your backend.
///
/// A backend written against `distlock` alone (one process, one mutex; the
/// conformance suite proves a real one):
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// use distlock::backend::{Kind, LockRequest, async_trait};
/// use distlock::{
///     Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
///     Locker, OwnerToken, ReleaseOutcome,
/// };
///
/// #[derive(Debug, Default)]
/// struct Tiny {
///     /// name → (owner, fence); the last fence handed out.
///     state: Mutex<(HashMap<LockName, (OwnerToken, FencingToken)>, u64)>,
/// }
///
/// #[async_trait]
/// impl LockBackend for Tiny {
///     fn capabilities(&self) -> Capabilities {
///         Capabilities::new("tiny")
///     }
///
///     async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
///         if request.kind() != Kind::Lock {
///             return Err(request.kind().unsupported("tiny"));
///         }
///         let sent = request.now();
///         let mut state = self.state.lock().unwrap();
///         if state.0.contains_key(request.name()) {
///             return Ok(Attempt::Held { expires_in: None });
///         }
///         state.1 += 1;
///         let (owner, fence) = (OwnerToken::new(), FencingToken::new(state.1).unwrap());
///         state.0.insert(request.name().clone(), (owner, fence));
///         Ok(Attempt::Acquired(Lease::granted(request, owner, fence, sent)))
///     }
///
///     async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
///         let state = self.state.lock().unwrap();
///         let held = |l: &Lease| state.0.get(l.name()) == Some(&(l.owner(), l.fence()));
///         (leases.iter())
///             .map(|l| match held(l) {
///                 true => Ok(l.renewed(l.now())),
///                 false => Err(LockError::NotHeld { name: l.name().clone() }),
///             })
///             .collect()
///     }
///
///     async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
///         let mut state = self.state.lock().unwrap();
///         if state.0.get(lease.name()) != Some(&(lease.owner(), lease.fence())) {
///             return Ok(ReleaseOutcome::NotHeld);
///         }
///         state.0.remove(lease.name());
///         Ok(ReleaseOutcome::Released)
///     }
///
///     async fn holders(&self, name: &LockName, _: Kind) -> Result<Vec<Holder>, LockError> {
///         let state = self.state.lock().unwrap();
///         let holder = state.0.get(name).map(|&(owner, fence)| {
///             Holder::new(fence, Some(owner), None)
///         });
///         Ok(holder.into_iter().collect())
///     }
///
///     async fn evict(
///         &self,
///         name: &LockName,
///         expected: Option<FencingToken>,
///     ) -> Result<Option<Holder>, LockError> {
///         let mut state = self.state.lock().unwrap();
///         match state.0.get(name) {
///             Some(&(owner, fence)) if expected.is_none_or(|f| f == fence) => {
///                 state.0.remove(name);
///                 Ok(Some(Holder::new(fence, Some(owner), None)))
///             }
///             _ => Ok(None),
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let locker = Locker::new(Tiny::default());
/// let guard = locker.acquire("settlement").await?;
/// assert_eq!(guard.fencing_token().get(), 1);
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub mod backend {
    pub use lockcore::backend::*;
}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use lock_sqlite as sqlite;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use lock_redis as redis;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use lock_postgres as postgres;

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use lock_etcd as etcd;

#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use lock_zookeeper as zookeeper;
