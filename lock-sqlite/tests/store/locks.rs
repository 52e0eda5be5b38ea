//! Renewals: a batch renewal renews each lease only on its own grant's row
//! (kind, name, slot, owner and fence, not the fence alone).

use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::backend::{LockRequest, Moment};
use lockcore::{Lease, LockBackend, LockError, LockName, OwnerToken};

use crate::support::{self, name};

/// `lease`'s fence under another owner, name, slot or kind: what a batch
/// must not renew.
fn forgeries(lease: &Lease) -> Vec<(&'static str, Lease)> {
    let forged = |name: &LockName, owner| {
        Lease::new(
            name.clone(),
            owner,
            lease.fence(),
            lease.ttl(),
            Moment::now(),
        )
    };
    let mut out = vec![
        ("another owner", forged(lease.name(), OwnerToken::new())),
        ("another name", forged(&name("elsewhere"), lease.owner())),
    ];
    out.push(match lease.slot() {
        Some(slot) => (
            "another slot",
            forged(lease.name(), lease.owner()).with_slot(slot + 1),
        ),
        None => (
            "a permit of the same name",
            forged(lease.name(), lease.owner()).with_slot(0),
        ),
    });
    if lease.slot().is_some() {
        out.push((
            "a lock of the same name",
            forged(lease.name(), lease.owner()),
        ));
    }
    out
}

#[tokio::test]
async fn a_batch_renews_each_lease_on_its_own_grant_only() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(60))
        .unwrap();
    let lock = backend
        .try_acquire(&LockRequest::new(name("batched"), ttl))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let permit = backend
        .try_acquire_permit(&LockRequest::new(name("batched-permits"), ttl), 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let mut batch = Vec::new();
    for real in [&lock, &permit] {
        batch.push(("the real grant", real.clone()));
        batch.extend(forgeries(real));
    }
    let leases: Vec<Lease> = batch.iter().map(|(_, l)| l.clone()).collect();
    let results = backend.renew_many(&leases).await;
    assert_eq!(results.len(), leases.len());
    for ((what, lease), result) in batch.iter().zip(&results) {
        match (*what, result) {
            ("the real grant", Ok(renewed)) => assert!(renewed.same_grant(lease)),
            ("the real grant", Err(e)) => panic!("{}: {e}", lease.name()),
            (_, Err(LockError::NotHeld { .. })) => {}
            (_, other) => panic!(
                "{what} with the fence of {} was answered {other:?}",
                lease.name()
            ),
        }
    }
    // The forgeries disturbed nothing.
    for real in [&lock, &permit] {
        backend.renew(real).await.unwrap();
        assert_eq!(
            backend.release(real).await.unwrap(),
            lockcore::ReleaseOutcome::Released
        );
    }
    backend.close().await.unwrap();
}
