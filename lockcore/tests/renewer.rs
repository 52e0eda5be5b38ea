//! The renewer: one task per locker renews every due lease in batches, and
//! batching changes cost, never the guarantees (virtual clock).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::{Kind, LockRequest, async_trait};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName, Locker,
    LossReason, MemoryBackend, ReleaseOutcome,
};
use tokio::time::{Instant, sleep};

/// `MemoryBackend` that records every `renew_many` batch and can refuse the
/// renewals of chosen names.
#[derive(Debug, Default)]
struct Batching {
    store: MemoryBackend,
    batches: Mutex<Vec<usize>>,
    singles: AtomicUsize,
    refuse: Mutex<Vec<String>>,
}

#[async_trait]
impl LockBackend for Batching {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.store.try_acquire(request).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.singles.fetch_add(1, Ordering::SeqCst);
        self.store.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.batches.lock().unwrap().push(leases.len());
        let refuse = self.refuse.lock().unwrap().clone();
        let mut out = Vec::new();
        for lease in leases {
            out.push(if refuse.iter().any(|n| n == lease.name().as_str()) {
                Err(LockError::NotHeld {
                    name: lease.name().clone(),
                })
            } else {
                self.store.renew(lease).await
            });
        }
        out
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
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

const TTL: Duration = Duration::from_secs(30);

/// `lost()`, bounded in virtual time: a loss never reported fails the test
/// instead of hanging it.
async fn lost(guard: &lockcore::LockGuard) -> LossReason {
    tokio::time::timeout(Duration::from_secs(60), guard.lost())
        .await
        .expect("the loss was never reported")
}

#[tokio::test(start_paused = true)]
async fn a_thousand_guards_converge_on_one_batch_per_interval() {
    let backend = Arc::new(Batching::default());
    let locker = Locker::new(backend.clone()).ttl(TTL);
    let mut guards = Vec::new();
    // Acquired over a whole renew interval, so their renewals start out of step.
    for i in 0..1_000 {
        guards.push(locker.acquire(format!("tenant-{i}")).await.unwrap());
        sleep(Duration::from_millis(10)).await;
    }
    sleep(TTL).await; // let the renewals converge
    backend.batches.lock().unwrap().clear();
    sleep(TTL / 3).await; // one renew interval
    let batches = backend.batches.lock().unwrap().clone();
    assert_eq!(
        batches,
        vec![1_000],
        "one batch of every lease per interval"
    );
    assert_eq!(
        backend.singles.load(Ordering::SeqCst),
        0,
        "no renewal one by one"
    );
    assert!(guards.iter().all(|g| g.is_held()));
}

#[tokio::test(start_paused = true)]
async fn each_guard_gets_its_own_outcome_from_a_batch() {
    let backend = Arc::new(Batching::default());
    let locker = Locker::new(backend.clone()).ttl(TTL);
    let keep = locker.acquire("keep").await.unwrap();
    let refused = locker.acquire("refused").await.unwrap();
    backend.refuse.lock().unwrap().push("refused".into());
    assert_eq!(lost(&refused).await, LossReason::RenewalRefused);
    assert!(
        backend.batches.lock().unwrap().contains(&2),
        "both leases went in one batch"
    );
    assert!(
        keep.is_held(),
        "a refusal in the batch lost only its own lease"
    );
    sleep(TTL).await;
    assert!(keep.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_held_guard_is_lost_at_max_hold_and_its_lock_freed() {
    let store = MemoryBackend::new();
    let locker = Locker::new(store.clone())
        .ttl(Duration::from_secs(3))
        .max_hold(Duration::from_secs(10));
    let guard = locker.acquire("stuck").await.unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(lost(&guard).await, LossReason::MaxHoldExceeded);
    let held_for = started.elapsed();
    assert!(
        held_for >= Duration::from_secs(10) && held_for <= Duration::from_millis(10_050),
        "lost after {held_for:?}"
    );
    assert!(!guard.is_held());
    // Renewals succeeded all along; the cap alone ended it, and freed the lock.
    let other = Locker::new(store);
    let mut freed = false;
    for _ in 0..100 {
        if other.try_acquire("stuck").await.unwrap().is_some() {
            freed = true;
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the capped lock was not released");
}

#[tokio::test(start_paused = true)]
async fn labels_are_stored_and_never_decide_ownership() {
    let store = MemoryBackend::new();
    let a = Locker::new(store.clone()).label("worker a".parse().unwrap());
    let b = Locker::new(store.clone()).label("worker a".parse().unwrap());
    let guard = a.acquire("labelled").await.unwrap();
    let holder = b.inspect("labelled").await.unwrap().expect("held");
    assert_eq!(holder.label.as_ref().map(|l| l.as_str()), Some("worker a"));
    // Same label, different owner: b cannot take or release a's lock.
    assert!(b.try_acquire("labelled").await.unwrap().is_none());
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let mine = b.acquire("labelled").await.unwrap();
    assert!(mine.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_short_hold_cap_fires_at_the_cap() {
    // Shorter than the renew interval and than the renewer's one-second
    // look; then past its first look, before its second.
    for cap in [Duration::from_millis(200), Duration::from_millis(1_500)] {
        let locker = Locker::new(MemoryBackend::new()).ttl(TTL).max_hold(cap);
        let guard = locker.acquire("short-cap").await.unwrap();
        let held = Instant::now();
        assert_eq!(lost(&guard).await, LossReason::MaxHoldExceeded);
        let took = held.elapsed();
        assert!(
            took >= cap && took <= cap + Duration::from_millis(5),
            "a {cap:?} hold cap fired after {took:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_come_at_the_interval_not_at_the_once_a_second_look() {
    let backend = Arc::new(Batching::default());
    let every = Duration::from_millis(700);
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(3))
        .renew_every(every);
    let guard = locker.acquire("n").await.unwrap();
    sleep(every * 2 + Duration::from_millis(10)).await;
    assert_eq!(
        backend.batches.lock().unwrap().len(),
        2,
        "renewed at 700 ms and at 1400 ms"
    );
    assert!(guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn guards_stay_renewed_after_their_locker_is_dropped() {
    let backend = Arc::new(Batching::default());
    let guard = Locker::new(backend.clone())
        .ttl(Duration::from_secs(3))
        .acquire("n")
        .await
        .unwrap();
    // The locker (the renewer's only handle) is gone; the guard is not.
    sleep(Duration::from_secs(9)).await;
    assert!(guard.is_held(), "{:?}", guard.loss_reason());
    assert!(backend.batches.lock().unwrap().len() >= 8);
}

/// Counts this thread's WARN events about long holds (the renewer task runs
/// on the test's own thread: a current-thread runtime).
struct LongHoldWarnings(Arc<AtomicUsize>);

impl tracing::Subscriber for LongHoldWarnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        if *meta.level() == tracing::Level::WARN && meta.fields().field("held_for").is_some() {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(start_paused = true)]
async fn a_long_hold_is_warned_of_once_at_its_threshold() {
    let warnings = Arc::new(AtomicUsize::new(0));
    let _capture = tracing::subscriber::set_default(LongHoldWarnings(warnings.clone()));
    // Between the renewer's one-second looks.
    let threshold = Duration::from_millis(2_500);
    let locker = Locker::new(MemoryBackend::new())
        .ttl(TTL)
        .long_hold(threshold);
    let guard = locker.acquire("long").await.unwrap();
    sleep(threshold - Duration::from_millis(1)).await;
    assert_eq!(
        warnings.load(Ordering::SeqCst),
        0,
        "warned before the threshold"
    );
    sleep(Duration::from_millis(2)).await;
    assert_eq!(
        warnings.load(Ordering::SeqCst),
        1,
        "no warning at the threshold"
    );
    sleep(TTL).await;
    assert_eq!(warnings.load(Ordering::SeqCst), 1, "warned more than once");
    assert!(guard.is_held(), "a long hold is only warned of");
}
