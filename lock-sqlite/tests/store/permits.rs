//! Semaphores on the lock file: slots with their own growing fences, a
//! mismatched permit count refused while permits are held, holders with
//! their labels, and waiters woken when a permit is released.

use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::backend::{Kind, LockRequest};
use lockcore::{HolderLabel, LockBackend, LockError, LockName};

async fn backend(dir: &tempfile::TempDir) -> SqliteBackend {
    SqliteBackend::connect(&format!("sqlite://{}/locks.db", dir.path().display()))
        .await
        .unwrap()
}

fn request(b: &SqliteBackend, name: &str, label: &str) -> LockRequest {
    let ttl = b
        .capabilities()
        .effective_ttl(Duration::from_secs(60))
        .unwrap();
    LockRequest::new(LockName::new(name).unwrap(), ttl).with_label(HolderLabel::new(label).unwrap())
}

#[tokio::test]
async fn two_permits_two_slots_and_a_mismatch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (backend(&dir).await, backend(&dir).await);
    let first = a
        .try_acquire_permit(&request(&a, "uploads", "a"), 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let second = b
        .try_acquire_permit(&request(&b, "uploads", "b"), 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert_ne!(first.slot(), second.slot());
    assert!(
        b.try_acquire_permit(&request(&b, "uploads", "c"), 2)
            .await
            .unwrap()
            .into_lease()
            .is_none(),
        "a third permit of two"
    );
    let mismatch = b.try_acquire_permit(&request(&b, "uploads", "d"), 3).await;
    assert!(
        matches!(
            mismatch,
            Err(LockError::PermitsMismatch {
                requested: 3,
                existing: 2,
                ..
            })
        ),
        "{mismatch:?}"
    );
    // A lock of the same name is another namespace.
    assert!(
        a.try_acquire(&request(&a, "uploads", "lock"))
            .await
            .unwrap()
            .into_lease()
            .is_some()
    );
    let mut holders = a
        .inspect_permits(&LockName::new("uploads").unwrap())
        .await
        .unwrap();
    holders.sort_by_key(|h| h.slot);
    let labels: Vec<_> = holders
        .iter()
        .map(|h| h.label.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(holders.len(), 2);
    assert!(labels.contains(&"a".to_owned()) && labels.contains(&"b".to_owned()));

    // A waiter is woken by the release of either permit; its slot's fence grows.
    let wakeup = b
        .watch(&LockName::new("uploads").unwrap(), Kind::Semaphore)
        .await
        .unwrap()
        .expect("the file notifies");
    let slot = first.slot();
    a.release(&first).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), wakeup)
        .await
        .unwrap();
    let again = b
        .try_acquire_permit(&request(&b, "uploads", "e"), 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert_eq!(again.slot(), slot);
    assert!(again.fence() > second.fence() && again.fence() > first.fence());
    // With nobody holding one, the count may change.
    b.release(&again).await.unwrap();
    b.release(&second).await.unwrap();
    assert!(
        a.try_acquire_permit(&request(&a, "uploads", "f"), 3)
            .await
            .unwrap()
            .into_lease()
            .is_some()
    );
}
