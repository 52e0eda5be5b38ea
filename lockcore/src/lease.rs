//! A lease: what a backend hands out on acquire and renew.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, Moment, SystemClock};
use crate::request::{Access, Kind, LockRequest};
use crate::ttl::Ttl;
use crate::{FencingToken, HolderLabel, LockName, OwnerToken};

/// One grant of a lock: name, owner, fencing token, the TTL the store really
/// enforces, and a local deadline.
///
/// The local deadline counts from the moment *before* the request was sent:
/// `sent_at + ttl - margin`, where the margin is [`drift`](Self::drift) plus
/// whatever the backend adds for how its store really expires
/// ([`with_extra_margin`](Self::with_extra_margin)). Whatever the store says
/// later, the client treats the lock as lost at that point unless a renewal
/// succeeded first, so a slow reply can never stretch the lease. Elapsed time
/// is the larger of the monotonic clock and the boot clock (see
/// [`Moment`]), so a host suspend counts too.
///
/// A lease is judged on the clock its send time was read on
/// ([`clock`](Self::clock)): both readings of that [`Moment`] are taken
/// before the request leaves and carried forward as they are, never
/// rebuilt later from "now" (which would erase a suspend in between).
#[derive(Clone)]
pub struct Lease {
    name: LockName,
    owner: OwnerToken,
    fence: FencingToken,
    ttl: Ttl,
    issued: Moment,
    clock: Arc<dyn Clock>,
    extra_margin: Duration,
    slot: Option<u32>,
    access: Option<Access>,
    /// Shared, so cloning a lease (the renewer does, for every lease it
    /// renews) costs a reference count, not a lock of the token's tree.
    lost: Option<Arc<CancellationToken>>,
    extension: Option<Arc<dyn Any + Send + Sync>>,
}

impl Lease {
    /// A lease granted for `request` by a request sent at `sent_at` (read
    /// with [`LockRequest::now`] before any I/O): its name, TTL and clock
    /// come from the request.
    pub fn granted(
        request: &LockRequest,
        owner: OwnerToken,
        fence: FencingToken,
        sent_at: Moment,
    ) -> Self {
        let lease = Lease::new(request.name().clone(), owner, fence, request.ttl(), sent_at)
            .with_clock(request.clock().clone());
        match request.access() {
            Some(access) => lease.with_access(access),
            None => lease,
        }
    }

    /// A lease granted by a request sent at `sent_at`, read on the system
    /// clocks ([`Moment::now`]) before any I/O. Backends serving a
    /// [`LockRequest`] use [`granted`](Self::granted), which keeps the
    /// request's clock.
    pub fn new(
        name: LockName,
        owner: OwnerToken,
        fence: FencingToken,
        ttl: Ttl,
        sent_at: Moment,
    ) -> Self {
        Lease {
            name,
            owner,
            fence,
            ttl,
            issued: sent_at,
            clock: Arc::new(SystemClock),
            extra_margin: Duration::ZERO,
            slot: None,
            access: None,
            lost: None,
            extension: None,
        }
    }

    /// The safety margin taken off every lease for clock-rate differences
    /// between client and store: 1% of the TTL plus 2 ms.
    pub fn drift(ttl: Duration) -> Duration {
        ttl / 100 + Duration::from_millis(2)
    }

    /// Widens the local margin by `extra`, for stores that may expire a
    /// lease earlier than `sent_at + ttl - drift` (ZooKeeper's tick-sized
    /// session buckets, say). Renewals keep it.
    pub fn with_extra_margin(mut self, extra: Duration) -> Self {
        self.extra_margin = extra;
        self
    }

    /// The same grant with another TTL (the one the store really enforces,
    /// when it differs from what was asked).
    pub fn with_ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = ttl;
        self
    }

    /// Marks this lease as a semaphore permit holding `slot`.
    pub fn with_slot(mut self, slot: u32) -> Self {
        self.slot = Some(slot);
        self
    }

    /// The semaphore slot this lease holds (`None` for a lock).
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// Marks this lease as a share of the reader-writer lock of its name.
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = Some(access);
        self
    }

    /// How this lease holds the reader-writer lock of its name (`None` for
    /// a lock or a permit).
    pub fn access(&self) -> Option<Access> {
        self.access
    }

    /// What this lease holds: the lock, a permit, or a reader-writer share.
    pub fn kind(&self) -> Kind {
        match (self.access, self.slot) {
            (Some(_), _) => Kind::ReadWrite,
            (None, None) => Kind::Lock,
            (None, Some(_)) => Kind::Semaphore,
        }
    }

    /// The whole margin taken off the TTL for the local deadline.
    pub fn margin(&self) -> Duration {
        Self::drift(self.ttl.get()).saturating_add(self.extra_margin)
    }

    /// The same grant (name, owner, fence, TTL, margin, clock, extension,
    /// loss signal) renewed by a request sent at `sent_at`, read with
    /// [`now`](Self::now) before the renewal left.
    pub fn renewed(&self, sent_at: Moment) -> Self {
        Lease {
            issued: sent_at,
            ..self.clone()
        }
    }

    /// The same grant judged on `clock`, the clock its send time was read
    /// on (backends with a clock of their own, such as a session's).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock this lease is judged on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The clocks now, on this lease's clock: what a renewal reads before
    /// it is sent.
    pub fn now(&self) -> Moment {
        self.clock.now()
    }

    /// When each renewal of `batch` is sent, for backends that renew a
    /// batch in one request: the clocks read on each lease's own clock
    /// before the request leaves, once per run of leases on the same clock
    /// (the leases of one locker share theirs).
    pub fn send_times(batch: &[Lease]) -> Vec<Moment> {
        let mut last: Option<(&Arc<dyn Clock>, Moment)> = None;
        batch
            .iter()
            .map(|lease| match last {
                Some((clock, now)) if Arc::ptr_eq(clock, &lease.clock) => now,
                _ => {
                    let now = lease.now();
                    last = Some((&lease.clock, now));
                    now
                }
            })
            .collect()
    }

    /// Whether `other` is this same grant (name, owner, fence, slot),
    /// whatever its send time: what a renewal must hand back.
    pub fn same_grant(&self, other: &Lease) -> bool {
        self.name == other.name
            && self.owner == other.owner
            && self.fence == other.fence
            && self.slot == other.slot
    }

    /// Attaches a signal the backend cancels when the store tells it the lease
    /// is gone (session expired, keep-alive refused, connection lost).
    pub fn with_loss_signal(mut self, lost: CancellationToken) -> Self {
        self.lost = Some(Arc::new(lost));
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
        self.lost.as_deref()
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

    /// The TTL the store enforces (after its rounding or negotiation), as
    /// the validated [`Ttl`] a backend renews with ([`Ttl::get`] for the
    /// duration).
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// The same TTL as [`ttl`](Self::ttl).
    #[deprecated(since = "0.2.0", note = "use `ttl`, which returns the `Ttl` now")]
    pub fn checked_ttl(&self) -> Ttl {
        self.ttl
    }

    /// When the request that granted (or last renewed) this lease was sent,
    /// on the monotonic clock.
    #[deprecated(since = "0.2.0", note = "use `issued().mono()`")]
    pub fn issued_at(&self) -> Instant {
        self.issued.mono()
    }

    /// When the request that granted (or last renewed) this lease was sent.
    pub fn issued(&self) -> Moment {
        self.issued
    }

    /// The local deadline on the monotonic clock, after which the lease
    /// counts as lost; a host suspend brings the end earlier (see
    /// [`remaining_at`](Self::remaining_at)).
    pub fn deadline(&self) -> Instant {
        self.issued.mono() + self.ttl.get().saturating_sub(self.margin())
    }

    /// Time left before the local deadline as of `now` (zero once passed),
    /// counting time the host spent suspended.
    pub fn remaining_at(&self, now: Moment) -> Duration {
        self.ttl
            .get()
            .saturating_sub(self.margin())
            .saturating_sub(now.since(self.issued))
    }

    /// Time left before the local deadline (zero once passed), on this
    /// lease's clock.
    pub fn remaining(&self) -> Duration {
        self.remaining_at(self.now())
    }

    /// Whether, as of `now`, the local deadline has passed or the store
    /// reported the loss.
    pub fn is_expired_at(&self, now: Moment) -> bool {
        self.remaining_at(now).is_zero() || self.lost.as_ref().is_some_and(|t| t.is_cancelled())
    }

    /// Whether the local deadline has passed or the store reported the loss.
    pub fn is_expired(&self) -> bool {
        self.is_expired_at(self.now())
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("slot", &self.slot)
            .field("access", &self.access)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// What [`holders`](crate::LockBackend::holders) sees of a current holder.
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
    /// The label stored with the lease: who holds it, in words. `None` for
    /// leases granted without one (an older client).
    pub label: Option<HolderLabel>,
    /// The semaphore slot held (`None` for a lock).
    pub slot: Option<u32>,
    /// How a reader-writer lock is held (`None` for a lock or a permit).
    pub access: Option<Access>,
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
            label: None,
            slot: None,
            access: None,
        }
    }

    /// The same view of a reader-writer lock's holder.
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = Some(access);
        self
    }

    /// The same view of a semaphore permit holding `slot`.
    pub fn with_slot(mut self, slot: u32) -> Self {
        self.slot = Some(slot);
        self
    }

    /// The same view with the stored label.
    pub fn with_label(mut self, label: Option<HolderLabel>) -> Self {
        self.label = label;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that counts its readings, each one a second of boot time
    /// past the last.
    #[derive(Debug, Default)]
    struct Counting(std::sync::atomic::AtomicU64);

    impl Clock for Counting {
        fn now(&self) -> Moment {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            Moment::from_parts(Instant::now(), Some(Duration::from_secs(n)))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_reads_each_clock_once_and_each_lease_on_its_own() {
        let lease = |clock: &Arc<Counting>| {
            Lease::new(
                LockName::new("n").unwrap(),
                OwnerToken::new(),
                FencingToken::new(1).unwrap(),
                Ttl::checked(Duration::from_secs(10)),
                Moment::now(),
            )
            .with_clock(clock.clone())
        };
        let (a, b) = (Arc::new(Counting::default()), Arc::new(Counting::default()));
        b.now(); // b is one reading ahead: its next is 2 s
        let batch = [lease(&a), lease(&a), lease(&b), lease(&b)];
        let boots: Vec<_> = Lease::send_times(&batch)
            .iter()
            .map(|m| m.boot().unwrap().as_secs())
            .collect();
        assert_eq!(boots, [1, 1, 2, 2]);
        assert_eq!(a.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(b.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_counts_from_the_send_time_minus_drift() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(3).unwrap(),
            Ttl::checked(ttl),
            Moment::now(),
        );
        assert_eq!(lease.deadline(), sent + ttl - Duration::from_millis(102));
        tokio::time::advance(Duration::from_secs(5)).await;
        let renewed = lease.renewed(Moment::now());
        assert_eq!(renewed.fence(), lease.fence());
        assert!(renewed.deadline() > lease.deadline());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(lease.is_expired() && !renewed.is_expired());
    }

    #[tokio::test(start_paused = true)]
    async fn a_host_suspend_counts_toward_the_deadline() {
        let t0 = Instant::now();
        let boot0 = Duration::from_secs(1_000);
        let ttl = Duration::from_secs(30);
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(1).unwrap(),
            Ttl::checked(ttl),
            Moment::from_parts(t0, Some(boot0)),
        );
        let awake = Moment::from_parts(
            t0 + Duration::from_secs(5),
            Some(boot0 + Duration::from_secs(5)),
        );
        assert_eq!(
            lease.remaining_at(awake),
            ttl - lease.margin() - Duration::from_secs(5)
        );
        assert!(!lease.is_expired_at(awake));
        // The host slept 40 s: the monotonic clock saw 5 s, the store saw 45 s.
        let resumed = Moment::from_parts(
            t0 + Duration::from_secs(5),
            Some(boot0 + Duration::from_secs(45)),
        );
        assert!(lease.is_expired_at(resumed));
        assert_eq!(lease.remaining_at(resumed), Duration::ZERO);
        // The monotonic deadline itself does not move.
        assert_eq!(lease.deadline(), t0 + ttl - lease.margin());
    }

    #[test]
    fn an_extra_margin_brings_the_deadline_earlier_and_survives_renewal() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(4);
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(1).unwrap(),
            Ttl::checked(ttl),
            Moment::from_parts(t0, None),
        )
        .with_extra_margin(Duration::from_millis(500));
        assert_eq!(
            lease.margin(),
            Lease::drift(ttl) + Duration::from_millis(500)
        );
        assert_eq!(lease.deadline(), t0 + ttl - lease.margin());
        let renewed = lease.renewed(Moment::from_parts(t0 + Duration::from_secs(1), None));
        assert_eq!(renewed.margin(), lease.margin());
    }

    #[test]
    fn extensions_are_typed() {
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(1).unwrap(),
            Ttl::checked(Duration::from_secs(1)),
            Moment::now(),
        )
        .with_extension(42_i64);
        assert_eq!(lease.extension::<i64>(), Some(&42));
        assert_eq!(lease.extension::<String>(), None);
    }
}
