//! Audit events for administrative actions.
//!
//! Every forced release ([`Locker::force_release`](crate::Locker::force_release),
//! [`admin::force_release`](crate::admin::force_release)) emits two
//! [`ForcedRelease`] events with the same `id`: [`Stage::Requested`] before
//! the request leaves, and the outcome after ([`Stage::Evicted`],
//! [`Stage::NothingEvicted`] or, when the reply was lost, [`Stage::Unknown`]).
//! So a lost reply still leaves a record that an eviction may have happened.
//! Each event goes out as a `tracing` event at WARN on target
//! `distlock::audit`, and on a process-wide channel that applications can
//! forward to their own audit log with [`subscribe`].

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use tokio::sync::broadcast;

use crate::{FencingToken, Holder, LockName};

/// One stage of one forced release.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// Ties the request to its outcome (unique in this process).
    pub id: u64,
    /// Which backend.
    pub backend: &'static str,
    /// The lock.
    pub name: LockName,
    /// Evict only the holder with this fence (compare-and-evict), if set.
    pub expected_fence: Option<FencingToken>,
    /// The reason the operator gave.
    pub reason: String,
    /// Where the eviction stands.
    pub stage: Stage,
    /// When.
    pub at: SystemTime,
}

/// Where a forced release stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// About to be sent; nothing has happened yet.
    Requested,
    /// The store evicted this holder; the next grant gets a larger fence.
    Evicted(Holder),
    /// Nothing was evicted: the lock was free, or held under another fence
    /// than the expected one.
    NothingEvicted,
    /// The request failed or its reply was lost: the eviction may or may not
    /// have happened. Inspect the lock before trying again, and retry with
    /// the fence you saw so a retry never evicts the next holder.
    Unknown(String),
}

impl ForcedRelease {
    /// The [`Stage::Requested`] event of a new forced release.
    pub(crate) fn requested(
        backend: &'static str,
        name: LockName,
        expected_fence: Option<FencingToken>,
        reason: impl Into<String>,
    ) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ForcedRelease {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            backend,
            name,
            expected_fence,
            reason: reason.into(),
            stage: Stage::Requested,
            at: SystemTime::now(),
        }
    }

    /// The same forced release at a later `stage`, stamped now.
    pub(crate) fn then(&self, stage: Stage) -> Self {
        ForcedRelease {
            stage,
            at: SystemTime::now(),
            ..self.clone()
        }
    }
}

fn channel() -> &'static broadcast::Sender<ForcedRelease> {
    static CHANNEL: OnceLock<broadcast::Sender<ForcedRelease>> = OnceLock::new();
    CHANNEL.get_or_init(|| broadcast::channel(1024).0)
}

/// Receives every audit event emitted after this call, in this process.
pub fn subscribe() -> broadcast::Receiver<ForcedRelease> {
    channel().subscribe()
}

/// Emits `event` as a WARN `tracing` event and on the [`subscribe`] channel.
pub(crate) fn emit(event: ForcedRelease) {
    let (stage, evicted) = match &event.stage {
        Stage::Requested => ("requested", None),
        Stage::Evicted(holder) => ("evicted", Some(holder)),
        Stage::NothingEvicted => ("nothing evicted", None),
        Stage::Unknown(_) => ("outcome unknown", None),
    };
    tracing::warn!(
        target: "distlock::audit",
        id = event.id,
        backend = event.backend,
        name = %event.name,
        expected_fence = event.expected_fence.map(FencingToken::get),
        evicted_fence = evicted.map(|h| h.fence.get()),
        evicted_owner = evicted.and_then(|h| h.owner).map(|o| o.to_string()),
        evicted_label = evicted.and_then(|h| h.label.as_ref()).map(|l| l.as_str()),
        error = match &event.stage { Stage::Unknown(e) => Some(e.as_str()), _ => None },
        reason = %event.reason,
        "forced release {stage}"
    );
    // No subscriber is fine: the tracing event above is the record.
    let _ = channel().send(event);
}
