//! `Locker::acquire_all` takes every name in one atomic attempt where the
//! backend can (the in-memory store), holding none while it waits, and one
//! by one in sorted order elsewhere, holding what it took while it waits.

use std::time::Duration;

use lockcore::backend::wait::{WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockRequest, async_trait};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName, Locker,
    MemoryBackend, ReleaseOutcome,
};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(10);

/// The in-memory store without its atomic multi-lock attempts.
#[derive(Debug, Clone)]
struct OneByOne(MemoryBackend);

#[async_trait]
impl LockBackend for OneByOne {
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities().atomic_multi(false)
    }
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.0.try_acquire(request).await
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
    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.0.watch(name, kind).await
    }
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.0.acquire(request, wait).await
    }
}

/// While `c` is held, a multi-lock of `a`, `c` waits; `a` is taken during
/// the wait exactly when `holds_while_waiting`. Once `c` is released, the
/// multi-lock gets both at once (woken, not polled), each with a fence
/// above `c`'s last.
async fn waits_for_c(backend: impl LockBackend + Clone, holds_while_waiting: bool) {
    let holder = Locker::new(backend.clone()).ttl(TTL);
    let held = holder.acquire("c").await.unwrap();
    let taker = Locker::new(backend.clone()).ttl(TTL);
    let waiting = tokio::spawn(async move { taker.acquire_all(["c", "a"]).await });
    sleep(Duration::from_millis(50)).await;
    assert_eq!(
        holder.inspect("a").await.unwrap().is_some(),
        holds_while_waiting,
        "a taken while the multi-lock waits for c"
    );
    let last = held.fencing_token();
    let released = Instant::now();
    held.release().await.unwrap();
    let both = waiting.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_millis(20),
        "woken by the release, not a retry: {:?}",
        released.elapsed()
    );
    assert!(both.fencing_token("c").unwrap() > last);
    assert!(both.fencing_token("a").is_some() && both.is_held());
    both.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_atomic_multi_lock_holds_nothing_while_it_waits() {
    let store = MemoryBackend::new();
    assert!(store.capabilities().atomic_multi);
    waits_for_c(store, false).await;
}

#[tokio::test(start_paused = true)]
async fn elsewhere_a_multi_lock_takes_its_names_one_by_one_in_order() {
    waits_for_c(OneByOne(MemoryBackend::new()), true).await;
}

#[tokio::test(start_paused = true)]
async fn an_atomic_try_acquire_all_takes_nothing_when_one_name_is_held() {
    let store = MemoryBackend::new();
    let locker = Locker::new(store.clone()).ttl(TTL);
    let held = locker.acquire("b").await.unwrap();
    assert!(
        locker
            .try_acquire_all(["a", "b", "c"])
            .await
            .unwrap()
            .is_none()
    );
    for name in ["a", "c"] {
        assert!(
            locker.inspect(name).await.unwrap().is_none(),
            "{name} taken"
        );
    }
    held.release().await.unwrap();
    let all = locker
        .try_acquire_all(["c", "a", "b"])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(all.names().len(), 3);
}
