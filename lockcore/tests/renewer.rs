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
use tokio::time::sleep;

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
    assert_eq!(refused.lost().await, LossReason::RenewalRefused);
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
    assert_eq!(guard.lost().await, LossReason::MaxHoldExceeded);
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
    // Shorter than the renew interval and than the renewer's one-second look.
    let cap = Duration::from_millis(200);
    let locker = Locker::new(MemoryBackend::new()).ttl(TTL).max_hold(cap);
    let guard = locker.acquire("short-cap").await.unwrap();
    let held = tokio::time::Instant::now();
    assert_eq!(guard.lost().await, LossReason::MaxHoldExceeded);
    let took = held.elapsed();
    assert!(
        took >= cap && took <= cap + Duration::from_millis(5),
        "a {cap:?} hold cap fired after {took:?}"
    );
}
