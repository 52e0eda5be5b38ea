//! A lease: what a backend hands out on acquire and renew.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{FencingToken, LockName, OwnerToken};

/// One grant of a lock: name, owner, fencing token, the TTL the store really
/// enforces, and a local deadline.
///
/// The local deadline is computed on the monotonic clock from the instant
/// *before* the request was sent: `sent_at + ttl - drift`. Whatever the store
/// says later, the client treats the lock as lost at that instant unless a
/// renewal succeeded first, so a slow reply can never stretch the lease.
#[derive(Clone)]
pub struct Lease {
    name: LockName,
    owner: OwnerToken,
    fence: FencingToken,
    ttl: Duration,
    issued_at: Instant,
    deadline: Instant,
    lost: Option<CancellationToken>,
    extension: Option<Arc<dyn Any + Send + Sync>>,
}

impl Lease {
    /// A lease granted by a request sent at `sent_at` (take `Instant::now()`
    /// before doing any I/O).
    pub fn new(
        name: LockName,
        owner: OwnerToken,
        fence: FencingToken,
        ttl: Duration,
        sent_at: Instant,
    ) -> Self {
        Lease {
            name,
            owner,
            fence,
            ttl,
            issued_at: sent_at,
            deadline: sent_at + ttl.saturating_sub(Self::drift(ttl)),
            lost: None,
            extension: None,
        }
    }

    /// The safety margin taken off every lease for clock-rate differences
    /// between client and store: 1% of the TTL plus 2 ms.
    pub fn drift(ttl: Duration) -> Duration {
        ttl / 100 + Duration::from_millis(2)
    }

    /// The same grant (name, owner, fence, extension, loss signal) renewed by
    /// a request sent at `sent_at` with effective TTL `ttl`.
    pub fn renewed(&self, ttl: Duration, sent_at: Instant) -> Self {
        Lease {
            ttl,
            issued_at: sent_at,
            deadline: sent_at + ttl.saturating_sub(Self::drift(ttl)),
            ..self.clone()
        }
    }

    /// Attaches a signal the backend cancels when the store tells it the lease
    /// is gone (session expired, keep-alive refused, connection lost).
    pub fn with_loss_signal(mut self, lost: CancellationToken) -> Self {
        self.lost = Some(lost);
        self
    }

    /// Attaches backend-private data (a node path, a lease id) that renew and
    /// release need. Other backends ignore it.
    pub fn with_extension<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.extension = Some(Arc::new(value));
        self
    }

    /// Backend-private data attached with [`with_extension`](Self::with_extension).
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.extension.as_deref()?.downcast_ref()
    }

    /// The store-side loss signal, if the backend has one.
    pub fn loss_signal(&self) -> Option<&CancellationToken> {
        self.lost.as_ref()
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Who holds it.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The fencing token of this grant; renewals keep it.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// The TTL the store enforces (after its rounding or negotiation).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the request that granted (or last renewed) this lease was sent.
    pub fn issued_at(&self) -> Instant {
        self.issued_at
    }

    /// The local monotonic deadline after which the lease counts as lost.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left before the local deadline (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the local deadline has passed or the store reported the loss.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.deadline || self.lost.as_ref().is_some_and(|t| t.is_cancelled())
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// What [`inspect`](crate::LockBackend::inspect) sees of the current holder.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's fencing token.
    pub fence: FencingToken,
    /// The holder's owner token, where the store keeps it.
    pub owner: Option<OwnerToken>,
    /// Time left before the store frees the name, where the store knows it
    /// (session-based leases do not).
    pub expires_in: Option<Duration>,
}

impl Holder {
    /// A holder view.
    pub fn new(
        fence: FencingToken,
        owner: Option<OwnerToken>,
        expires_in: Option<Duration>,
    ) -> Self {
        Holder {
            fence,
            owner,
            expires_in,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadline_counts_from_the_send_time_minus_drift() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(3).unwrap(),
            ttl,
            sent,
        );
        assert_eq!(lease.deadline(), sent + ttl - Duration::from_millis(102));
        tokio::time::advance(Duration::from_secs(5)).await;
        let renewed = lease.renewed(ttl, Instant::now());
        assert_eq!(renewed.fence(), lease.fence());
        assert!(renewed.deadline() > lease.deadline());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(lease.is_expired() && !renewed.is_expired());
    }

    #[test]
    fn extensions_are_typed() {
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(1).unwrap(),
            Duration::from_secs(1),
            Instant::now(),
        )
        .with_extension(42_i64);
        assert_eq!(lease.extension::<i64>(), Some(&42));
        assert_eq!(lease.extension::<String>(), None);
    }
}
