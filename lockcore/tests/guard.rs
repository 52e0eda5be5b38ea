//! The guard's renewal state machine on a virtual clock (tokio paused time):
//! when it renews, what counts as lost, and that a late reply never
//! resurrects a lease.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::backend::{Kind, LockBackendExt, LockRequest, async_trait};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName, Locker,
    LossReason, MemoryBackend, ReleaseOutcome,
};
use tokio::time::{Instant, advance, sleep};

/// What the next renewals do.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Renewal {
    Ok,
    Slow(Duration),
    Unavailable,
    Refused,
    /// Renewed on the store, then the host sleeps this long before the
    /// reply is read (a suspend while the renewal is in flight).
    SuspendInFlight(Duration),
    /// Answered with a lease of another grant (a backend that mixed up a batch).
    Other,
}

/// `MemoryBackend` with scripted renewals, counting calls.
#[derive(Debug, Default)]
struct Scripted {
    store: MemoryBackend,
    host: Mutex<Option<Arc<SleepyHost>>>,
    next: Mutex<Vec<Renewal>>,
    renews: AtomicUsize,
    releases: AtomicUsize,
}

impl Scripted {
    fn script(&self, steps: &[Renewal]) {
        let mut next = self.next.lock().unwrap();
        next.clear();
        next.extend(steps.iter().rev());
    }
}

#[async_trait]
impl LockBackend for Scripted {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.store.try_acquire(request).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        let step = self.next.lock().unwrap().pop().unwrap_or(Renewal::Ok);
        match step {
            Renewal::Ok => self.store.renew(lease).await,
            Renewal::Slow(delay) => {
                let sent = lease.now();
                sleep(delay).await;
                // The store did renew, late: the reply still counts from its send time.
                self.store.renew(lease).await.map(|l| l.renewed(sent))
            }
            Renewal::Unavailable => Err(LockError::unavailable("scripted", "connection reset")),
            Renewal::Refused => Err(LockError::NotHeld {
                name: lease.name().clone(),
            }),
            Renewal::SuspendInFlight(slept) => {
                let renewed = self.store.renew(lease).await;
                let host = self.host.lock().unwrap().clone();
                host.expect("a host to suspend").suspend_for(slept);
                renewed
            }
            Renewal::Other => {
                self.store.renew(lease).await?;
                Ok(Lease::new(
                    lease.name().clone(),
                    lockcore::OwnerToken::new(),
                    lease.fence(),
                    lease.ttl(),
                    lease.now(),
                ))
            }
        }
    }
    /// Each lease through the script, one by one, as a store without
    /// batches would.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut out = Vec::with_capacity(leases.len());
        for lease in leases {
            out.push(self.renew(lease).await);
        }
        out
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.store.release(lease).await
    }
    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.store.holders(name, kind).await
    }
    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.store.evict(name, expected).await
    }
}

const TTL: Duration = Duration::from_secs(3);

/// `lost()`, bounded in virtual time: a loss never reported fails the test
/// instead of hanging it.
async fn lost(guard: &lockcore::LockGuard) -> LossReason {
    tokio::time::timeout(Duration::from_secs(60), guard.lost())
        .await
        .expect("the loss was never reported")
}

fn setup() -> (Arc<Scripted>, Locker) {
    let backend = Arc::new(Scripted::default());
    let locker = Locker::new(backend.clone()).ttl(TTL);
    (backend, locker)
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl_and_keeps_the_fence() {
    let (backend, locker) = setup();
    let guard = locker.acquire("n").await.unwrap();
    let fence = guard.fencing_token();
    advance(Duration::from_millis(900)).await;
    assert_eq!(
        backend.renews.load(Ordering::SeqCst),
        0,
        "no renewal before TTL/3"
    );
    sleep(Duration::from_millis(200)).await;
    assert_eq!(
        backend.renews.load(Ordering::SeqCst),
        1,
        "one renewal at TTL/3"
    );
    sleep(TTL * 3).await;
    assert!(backend.renews.load(Ordering::SeqCst) >= 9);
    assert!(guard.is_held());
    assert_eq!(guard.fencing_token(), fence);
    assert!(guard.lease().deadline() > Instant::now() + TTL / 2);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(start_paused = true)]
async fn a_refused_renewal_loses_the_lease_at_once() {
    let (backend, locker) = setup();
    backend.script(&[Renewal::Refused]);
    let guard = locker.acquire("n").await.unwrap();
    let started = Instant::now();
    assert_eq!(lost(&guard).await, LossReason::RenewalRefused);
    assert!(started.elapsed() <= TTL / 3 + Duration::from_millis(10));
    assert!(!guard.is_held());
    assert!(matches!(guard.ensure_held(), Err(LockError::Lost { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_late_renewal_reply_never_resurrects_the_lease() {
    let (backend, locker) = setup();
    backend.script(&[Renewal::Slow(TTL * 2)]);
    let guard = locker.acquire("n").await.unwrap();
    let deadline = guard.lease().deadline();
    assert_eq!(lost(&guard).await, LossReason::RenewalUnanswered);
    assert!(Instant::now() >= deadline, "lost before the deadline");
    assert!(
        Instant::now() <= deadline + Duration::from_millis(1),
        "lost late"
    );
    sleep(TTL * 2).await; // the slow reply would have arrived by now
    assert!(!guard.is_held(), "a late reply resurrected the lease");
}

#[tokio::test(start_paused = true)]
async fn transient_errors_are_retried_until_the_deadline() {
    let (backend, locker) = setup();
    backend.script(&[Renewal::Unavailable, Renewal::Unavailable, Renewal::Ok]);
    let guard = locker.acquire("n").await.unwrap();
    sleep(TTL * 2).await;
    assert!(guard.is_held(), "recovered after two transient failures");
    assert!(backend.renews.load(Ordering::SeqCst) >= 3);

    backend.script(&[Renewal::Unavailable; 10_000]);
    let deadline = guard.lease().deadline();
    assert_eq!(lost(&guard).await, LossReason::RenewalUnanswered);
    assert!(Instant::now() >= deadline);
}

#[tokio::test(start_paused = true)]
async fn without_renewal_the_lease_is_lost_at_its_deadline() {
    let (backend, locker) = setup();
    let guard = locker.auto_renew(false).acquire("n").await.unwrap();
    let deadline = guard.lease().deadline();
    assert_eq!(
        deadline,
        guard.lease().issued().mono() + TTL - Lease::drift(TTL)
    );
    assert_eq!(lost(&guard).await, LossReason::DeadlinePassed);
    assert_eq!(Instant::now(), deadline);
    assert_eq!(backend.renews.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_store_loss_signal_is_reported() {
    let store = MemoryBackend::new();
    let signal = lockcore::backend::CancellationToken::new();
    let name = LockName::new("n").unwrap();
    let lease = store
        .try_acquire_for(&name, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap()
        .with_loss_signal(signal.clone());
    // Hand the lease to a guard through a backend that returns it as is.
    #[derive(Debug)]
    struct Fixed(MemoryBackend, Mutex<Option<Lease>>);
    #[async_trait]
    impl LockBackend for Fixed {
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        async fn try_acquire(&self, _: &LockRequest) -> Result<Attempt, LockError> {
            Ok(self
                .1
                .lock()
                .unwrap()
                .take()
                .map_or(Attempt::Held { expires_in: None }, Attempt::Acquired))
        }
        async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
            self.0.renew_many(leases).await
        }
        async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
            self.0.release(lease).await
        }
        async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
            self.0.holders(name, kind).await
        }
        async fn evict(
            &self,
            name: &LockName,
            expected: Option<FencingToken>,
        ) -> Result<Option<Holder>, LockError> {
            self.0.evict(name, expected).await
        }
    }
    let locker = Locker::new(Fixed(store, Mutex::new(Some(lease)))).ttl(TTL);
    let guard = locker
        .try_acquire("n")
        .await
        .unwrap()
        .expect("the fixed lease");
    sleep(Duration::from_millis(100)).await;
    assert!(guard.is_held());
    signal.cancel();
    assert_eq!(lost(&guard).await, LossReason::StoreReported);
    assert!(!guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn release_stops_renewing_and_drop_releases_in_the_background() {
    let (backend, locker) = setup();
    let guard = locker.acquire("n").await.unwrap();
    guard.release().await.unwrap();
    let renews = backend.renews.load(Ordering::SeqCst);
    sleep(TTL * 2).await;
    assert_eq!(
        backend.renews.load(Ordering::SeqCst),
        renews,
        "renewed after release"
    );

    let guard = locker.acquire("n").await.unwrap();
    drop(guard);
    let other = Locker::new(backend.store.clone()).ttl(TTL);
    sleep(Duration::from_millis(1)).await;
    assert!(
        other.try_acquire("n").await.unwrap().is_some(),
        "drop did not release"
    );
    assert_eq!(backend.releases.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn with_lock_stops_the_critical_section_on_loss() {
    let (backend, locker) = setup();
    backend.script(&[Renewal::Refused]);
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        locker.with_lock("n", |_| std::future::pending::<()>()),
    )
    .await
    .expect("the critical section was never stopped");
    assert!(
        matches!(
            outcome,
            Err(LockError::Lost {
                reason: LossReason::RenewalRefused,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(started.elapsed() <= TTL / 3 + Duration::from_millis(10));
    let done = locker
        .with_lock("n", |fence| async move { fence.get() })
        .await
        .unwrap();
    assert!(done >= 2);
}

/// The system clocks, with a boot clock that can be moved ahead as if the
/// host had been suspended (the monotonic clock stands still meanwhile).
#[derive(Debug, Default)]
struct SleepyHost {
    slept: Mutex<Duration>,
}

impl SleepyHost {
    fn suspend_for(&self, d: Duration) {
        *self.slept.lock().unwrap() += d;
    }

    /// Takes a suspend back: a clock reading from before it (what a stale
    /// reading looks like to whoever compares it).
    fn unsuspend(&self, d: Duration) {
        let mut slept = self.slept.lock().unwrap();
        *slept = slept.saturating_sub(d);
    }
}

impl lockcore::backend::Clock for SleepyHost {
    fn now(&self) -> lockcore::backend::Moment {
        let now = lockcore::backend::Moment::now();
        let boot = now.boot().unwrap_or_default() + *self.slept.lock().unwrap();
        lockcore::backend::Moment::from_parts(now.mono(), Some(boot))
    }
}

#[tokio::test(start_paused = true)]
async fn a_host_suspend_longer_than_the_ttl_loses_the_lease() {
    let host = Arc::new(SleepyHost::default());
    let locker = Locker::new(MemoryBackend::new())
        .ttl(TTL)
        .clock(host.clone());
    let guard = locker.acquire("n").await.unwrap();
    sleep(Duration::from_millis(100)).await;
    assert!(guard.is_held());
    host.suspend_for(TTL);
    // Monotonic time has not moved: only the boot clock says the TTL is gone.
    assert!(
        !guard.is_held(),
        "is_held() must count time spent suspended"
    );
    let started = Instant::now();
    assert_eq!(lost(&guard).await, LossReason::DeadlinePassed);
    assert!(
        started.elapsed() <= Duration::from_secs(1),
        "lost() fired {:?} after the resume",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_short_suspend_the_lease_is_renewed_and_kept() {
    let host = Arc::new(SleepyHost::default());
    let backend = Arc::new(Scripted::default());
    let locker = Locker::new(backend.clone()).ttl(TTL).clock(host.clone());
    let guard = locker.acquire("n").await.unwrap();
    // Asleep for half the TTL: past the renew point (TTL/3), before the deadline.
    host.suspend_for(TTL / 2);
    let renews = backend.renews.load(Ordering::SeqCst);
    // The renewer looks at the clocks at least once a second.
    sleep(Duration::from_millis(1_050)).await;
    assert!(
        backend.renews.load(Ordering::SeqCst) > renews,
        "no renewal after the resume"
    );
    assert!(guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_suspend_while_a_renewal_is_in_flight_counts_against_the_renewed_lease() {
    let host = Arc::new(SleepyHost::default());
    let backend = Arc::new(Scripted::default());
    *backend.host.lock().unwrap() = Some(host.clone());
    let locker = Locker::new(backend.clone()).ttl(TTL).clock(host.clone());
    let guard = locker.acquire("n").await.unwrap();
    // The first renewal (at TTL/3) is sent, then the host sleeps TTL/2
    // before its reply is read: the store counted that sleep from the send.
    backend.script(&[Renewal::SuspendInFlight(TTL / 2)]);
    sleep(TTL / 3 + Duration::from_millis(50)).await;
    assert_eq!(backend.renews.load(Ordering::SeqCst), 1);
    assert!(
        guard.is_held(),
        "the renewal came back before the old deadline"
    );
    let left = guard.lease().remaining();
    assert!(
        left <= TTL - TTL / 2,
        "the renewed lease claims {left:?} left, but it was sent {:?} ago on the boot clock",
        TTL / 2
    );
}

#[tokio::test(start_paused = true)]
async fn once_not_held_a_guard_never_reads_held_again() {
    let host = Arc::new(SleepyHost::default());
    let locker = Locker::new(MemoryBackend::new())
        .ttl(TTL)
        .auto_renew(false)
        .clock(host.clone());
    let guard = locker.acquire("n").await.unwrap();
    host.suspend_for(TTL);
    assert!(!guard.is_held());
    // A reading that comes later but looks earlier (a stale clock reading,
    // a renewal settling late) must not bring the guard back.
    host.unsuspend(TTL);
    assert!(!guard.is_held(), "a guard answered held after not held");
    assert_eq!(guard.loss_reason(), Some(LossReason::DeadlinePassed));
    assert_eq!(lost(&guard).await, LossReason::DeadlinePassed);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answered_with_another_lease_loses_the_guard() {
    let (backend, locker) = setup();
    backend.script(&[Renewal::Other]);
    let guard = locker.acquire("n").await.unwrap();
    let fence = guard.fencing_token();
    assert!(matches!(lost(&guard).await, LossReason::RenewalFailed(_)));
    assert!(!guard.is_held());
    assert_eq!(
        guard.fencing_token(),
        fence,
        "the other lease was not adopted"
    );
}

#[tokio::test(start_paused = true)]
async fn close_loses_every_guard_first_releases_them_and_closes_the_backend() {
    let store = MemoryBackend::new();
    let locker = Locker::new(store.clone()).ttl(TTL);
    let kept = locker.acquire("kept").await.unwrap();
    let dropped = locker.acquire("dropped").await.unwrap();
    drop(dropped);
    locker.close().await.unwrap();
    assert!(!kept.is_held());
    assert_eq!(kept.loss_reason(), Some(LossReason::Closed));
    assert_eq!(lost(&kept).await, LossReason::Closed);
    // Both names are free for another client at once.
    for name in ["kept", "dropped"] {
        let name = LockName::new(name).unwrap();
        assert_eq!(store.inspect(&name).await.unwrap(), None, "{name}");
    }
    // The closed backend refuses work: retrying on another client is the way.
    let err = locker.try_acquire("other").await.unwrap_err();
    assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
    assert!(matches!(
        kept.release().await,
        Err(LockError::Unavailable { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn closing_a_backend_fires_the_loss_of_its_leases_at_once() {
    // One client (shared, not cloned: a clone is another client).
    let store = Arc::new(MemoryBackend::new());
    let other = (*store).clone();
    let locker = Locker::from_arc(store.clone()).ttl(TTL);
    let guard = locker.acquire("n").await.unwrap();
    let mine = Locker::new(other.clone())
        .ttl(TTL)
        .acquire("m")
        .await
        .unwrap();
    store.close().await.unwrap();
    assert_eq!(lost(&guard).await, LossReason::StoreReported);
    assert!(!guard.is_held());
    // Another client of the same store is untouched.
    assert!(mine.is_held());
    assert!(
        other
            .inspect(&LockName::new("m").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_fence_floor_the_store_cannot_count_past_is_refused() {
    let store = MemoryBackend::new();
    let too_high = FencingToken::new(i64::MAX as u64 - 10).unwrap();
    let err = lockcore::admin::raise_fence_floor(&store, too_high)
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::InvalidConfig { .. }) && err.to_string().contains("at most"),
        "{err}"
    );
    let highest = FencingToken::new(store.capabilities().max_fence_floor()).unwrap();
    lockcore::admin::raise_fence_floor(&store, highest)
        .await
        .unwrap();
    let guard = Locker::new(store).acquire("n").await.unwrap();
    assert!(guard.fencing_token() > highest);
}

#[tokio::test(start_paused = true)]
async fn the_lost_token_fires_with_the_loss_and_cancelling_it_changes_nothing() {
    let (backend, locker) = setup();
    let guard = locker.acquire("n").await.unwrap();
    guard.lost_token().cancel();
    assert!(
        guard.is_held(),
        "a cancelled copy of the token lost the guard"
    );
    let token = guard.lost_token();
    backend.script(&[Renewal::Refused]);
    tokio::time::timeout(TTL, token.cancelled())
        .await
        .expect("the token fires when the lease is lost");
    assert_eq!(guard.loss_reason(), Some(LossReason::RenewalRefused));
}

#[tokio::test(start_paused = true)]
async fn a_guard_names_its_semaphore_slot_and_a_lock_has_none() {
    let locker = Locker::new(MemoryBackend::new()).ttl(TTL);
    let lock = locker.acquire("n").await.unwrap();
    assert_eq!(lock.slot(), None);
    let semaphore = locker.semaphore("s", 2).unwrap();
    let a = semaphore.try_acquire().await.unwrap().expect("a free slot");
    let b = semaphore.try_acquire().await.unwrap().expect("a free slot");
    let mut slots = [a.slot(), b.slot()];
    slots.sort();
    assert_eq!(slots, [Some(0), Some(1)]);
}

#[tokio::test(start_paused = true)]
async fn an_evicted_guard_reads_store_reported_and_is_renewed_no_more() {
    let (backend, locker) = setup();
    let guard = locker.acquire("n").await.unwrap();
    let name = LockName::new("n").unwrap();
    assert!(backend.store.evict(&name, None).await.unwrap().is_some());
    // Asked before the renewer has looked: still the store's word.
    assert!(!guard.is_held());
    assert_eq!(guard.loss_reason(), Some(LossReason::StoreReported));
    let renews = backend.renews.load(Ordering::SeqCst);
    sleep(TTL).await;
    assert_eq!(
        backend.renews.load(Ordering::SeqCst),
        renews,
        "an evicted lease was renewed"
    );
    assert_eq!(guard.loss_reason(), Some(LossReason::StoreReported));
}

#[tokio::test(start_paused = true)]
async fn guards_of_one_renewer_are_each_judged_on_their_own_clock() {
    let (host_a, host_b) = (
        Arc::new(SleepyHost::default()),
        Arc::new(SleepyHost::default()),
    );
    let a = Locker::new(MemoryBackend::new()).ttl(TTL).clock(host_a);
    // A clone shares the renewer: one task judges both guards.
    let b = a.clone().clock(host_b.clone());
    let kept = a.acquire("kept").await.unwrap();
    let slept = b.acquire("slept").await.unwrap();
    host_b.suspend_for(TTL);
    let reason = tokio::time::timeout(Duration::from_secs(2), slept.lost())
        .await
        .expect("lost at the renewer's next look");
    assert_eq!(reason, LossReason::DeadlinePassed);
    sleep(TTL).await; // several looks and renewals later
    assert!(kept.is_held(), "{:?}", kept.loss_reason());
}
