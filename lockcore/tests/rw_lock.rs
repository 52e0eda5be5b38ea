//! `RwLock` through `Locker` on the reference backend: refusals before any
//! I/O where the backend keeps no reader-writer locks, shares renewed like
//! locks, and a writer's intent that lasts exactly as long as its wait.

use std::time::Duration;

use lockcore::backend::{Kind, LockRequest, async_trait};
use lockcore::{
    Access, Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    Locker, MemoryBackend, ReleaseOutcome,
};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(3);

/// A backend that keeps locks only and fails the test on any store call.
#[derive(Debug)]
struct LocksOnly;

#[async_trait]
impl LockBackend for LocksOnly {
    fn capabilities(&self) -> Capabilities {
        MemoryBackend::new().capabilities().rw_locks(false)
    }
    async fn try_acquire(&self, _: &LockRequest) -> Result<Attempt, LockError> {
        panic!("no store call expected")
    }
    async fn renew_many(&self, _: &[Lease]) -> Vec<Result<Lease, LockError>> {
        panic!("no store call expected")
    }
    async fn release(&self, _: &Lease) -> Result<ReleaseOutcome, LockError> {
        panic!("no store call expected")
    }
    async fn holders(&self, _: &LockName, _: Kind) -> Result<Vec<Holder>, LockError> {
        panic!("no store call expected")
    }
    async fn evict(
        &self,
        _: &LockName,
        _: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        panic!("no store call expected")
    }
}

#[tokio::test]
async fn a_backend_without_reader_writer_locks_refuses_before_any_io() {
    let rw = Locker::new(LocksOnly).rw_lock("r").unwrap();
    for refused in [
        rw.try_read().await.map(|_| ()),
        rw.read().await.map(|_| ()),
        rw.try_write().await.map(|_| ()),
        rw.write_timeout(TTL).await.map(|_| ()),
    ] {
        assert!(
            matches!(
                refused,
                Err(LockError::Unsupported {
                    operation: "reader-writer locks",
                    ..
                })
            ),
            "{refused:?}"
        );
    }
    assert!(Locker::new(LocksOnly).rw_lock("not a valid\0name").is_err());
}

#[tokio::test(start_paused = true)]
async fn shares_are_renewed_and_shown_with_their_access() {
    let store = MemoryBackend::new();
    let rw = Locker::new(store.clone()).ttl(TTL).rw_lock("r").unwrap();
    let (a, b) = (rw.read().await.unwrap(), rw.read().await.unwrap());
    sleep(TTL * 3).await;
    assert!(a.is_held() && b.is_held(), "renewed past three TTLs");
    let holders = rw.holders().await.unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|h| h.access == Some(Access::Read)));
    assert!(holders.iter().all(|h| h.slot.is_none()));
    // A namespace apart: the lock of the same name is free.
    assert!(
        store
            .holders(a.lease().name(), Kind::Lock)
            .await
            .unwrap()
            .is_empty()
    );
    a.release().await.unwrap();
    b.release().await.unwrap();
    let w = rw
        .try_write()
        .await
        .unwrap()
        .expect("free once both readers left");
    assert_eq!(w.access(), Some(Access::Write));
    assert_eq!(w.slot(), None);
}

#[tokio::test(start_paused = true)]
async fn a_writers_intent_keeps_readers_out_only_while_it_waits() {
    let store = MemoryBackend::new();
    let (readers, writers) = (
        Locker::new(store.clone()).ttl(TTL),
        Locker::new(store).ttl(TTL),
    );
    let rw = readers.rw_lock("r").unwrap();
    let held = rw.read().await.unwrap();
    assert!(rw.try_read().await.unwrap().is_some(), "readers share");
    // try_write waits for nothing and leaves no intent.
    assert!(
        writers
            .rw_lock("r")
            .unwrap()
            .try_write()
            .await
            .unwrap()
            .is_none()
    );
    assert!(rw.try_read().await.unwrap().is_some());
    let waiting = tokio::spawn(async move { writers.rw_lock("r").unwrap().write().await });
    tokio::task::yield_now().await;
    sleep(Duration::from_millis(1)).await;
    assert!(rw.try_read().await.unwrap().is_none(), "a writer waits");
    waiting.abort();
    let _ = waiting.await;
    assert!(
        rw.try_read().await.unwrap().is_some(),
        "its wait was dropped"
    );
    held.release().await.unwrap();
}
