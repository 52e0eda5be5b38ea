//! Audit events for administrative actions.
//!
//! Every [`force_release`](crate::LockBackend::force_release) emits one
//! [`ForcedRelease`]: as a `tracing` event at WARN on target
//! `distlock::audit`, and on a process-wide channel that applications can
//! forward to their own audit log with [`subscribe`].

use std::sync::OnceLock;
use std::time::SystemTime;

use tokio::sync::broadcast;

use crate::{Holder, LockName};

/// One forced release.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// Which backend did it.
    pub backend: &'static str,
    /// The lock.
    pub name: LockName,
    /// Who was evicted, if anyone held the lock.
    pub evicted: Option<Holder>,
    /// The reason the operator gave.
    pub reason: String,
    /// When.
    pub at: SystemTime,
}

impl ForcedRelease {
    /// An event stamped now.
    pub fn new(
        backend: &'static str,
        name: LockName,
        evicted: Option<Holder>,
        reason: impl Into<String>,
    ) -> Self {
        ForcedRelease {
            backend,
            name,
            evicted,
            reason: reason.into(),
            at: SystemTime::now(),
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

/// Records the forced release of `name` (one [`ForcedRelease`] event) and
/// hands `evicted` back, so a backend's `force_release` ends with
/// `Ok(audit::forced_release(BACKEND, name, evicted, reason))`.
pub fn forced_release(
    backend: &'static str,
    name: &LockName,
    evicted: Option<Holder>,
    reason: &str,
) -> Option<Holder> {
    emit(ForcedRelease::new(
        backend,
        name.clone(),
        evicted.clone(),
        reason,
    ));
    evicted
}

/// Emits `event`; backends call this once per forced release.
pub fn emit(event: ForcedRelease) {
    tracing::warn!(
        target: "distlock::audit",
        backend = event.backend,
        name = %event.name,
        evicted_fence = event.evicted.as_ref().map(|h| h.fence.get()),
        evicted_owner = event.evicted.as_ref().and_then(|h| h.owner).map(|o| o.to_string()),
        reason = %event.reason,
        "lock force-released"
    );
    // No subscriber is fine: the tracing event above is the record.
    let _ = channel().send(event);
}
