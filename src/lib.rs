#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;

pub use connect::{SCHEMES, connect};

// The user API: what applications hold and handle.
pub use lockcore::{
    Backoff, Capabilities, Election, ExpiryClock, Fairness, FenceDurability, Fenced,
    FencedResource, FencedSlots, FencingToken, Holder, HolderLabel, IntoLockName, InvalidName,
    Leader, Leadership, Lease, LeaseKind, LockBackend, LockError, LockGuard, LockName, Locker,
    LossReason, MemoryBackend, Observer, OwnerToken, ReleaseOutcome, Semaphore, StaleToken,
};
// Administrative actions, their audit trail, and the metric names.
pub use lockcore::{admin, audit, metrics};

/// For backend authors: the [`LockBackend`] contract and the kit to
/// implement it (requests, validated TTLs, leases, clocks, the wait loop).
/// Run the `lock-conformance` suite against your backend.
pub mod backend {
    pub use lockcore::backend::*;
    pub use lockcore::wait;
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
