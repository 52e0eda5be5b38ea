//! Renewals, releases and takeovers judged on the row: a batch renewal
//! renews each lease only on its own grant's row (kind, name, slot, owner
//! and fence, not the fence alone), a release says whether the row still
//! counted (a forged one frees nothing), an eviction takes only the holder
//! it names and tells it at once, and an expired grant leaves no presence
//! file once taken over and no watch once its client grants again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_conformance::kit::{poll, scaled};
use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::backend::{LockRequest, Moment};
use lockcore::{FencingToken, Lease, LockBackend, LockError, LockName, OwnerToken, ReleaseOutcome};

use crate::support::{self, inotify_watching, name, watch_id};

/// A client of the lock file `file`.
async fn connect(file: &support::SqliteFactory) -> SqliteBackend {
    SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap()
}

/// `n` granted on `backend` for `ttl` (a free name).
async fn grant(backend: &SqliteBackend, n: &LockName, ttl: Duration) -> Lease {
    (backend.try_acquire_for(n, ttl).await.unwrap())
        .into_lease()
        .expect("a free name is granted")
}

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
    let backend = connect(&file).await;
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
            ReleaseOutcome::Released
        );
    }
    backend.close().await.unwrap();
}

/// A release after the row's expiry on the boot clock frees nothing that
/// still counted: it answers `NotHeld`, as when another took the lock.
#[tokio::test]
async fn a_release_after_the_row_expired_is_not_held() {
    let file = support::SqliteFactory::fresh();
    let backend = connect(&file).await;
    let n = name("expired");
    let lease = grant(&backend, &n, Duration::from_millis(50)).await;
    poll::until(
        scaled(Duration::from_secs(5)),
        "the row expires",
        || async { backend.inspect(&n).await.unwrap().is_none() },
    )
    .await;
    assert_eq!(
        backend.release(&lease).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    backend.close().await.unwrap();
}

/// A forged lease (the real fence under another owner, name, slot or
/// kind) released through the holder's own client or another frees
/// nothing: the release is `NotHeld`, and the real holder keeps its row and
/// its presence file with its `flock`, so no other client may take the lock
/// (and a holder that dies is still seen gone at once).
#[tokio::test]
async fn a_forged_release_leaves_the_real_holder_holding() {
    let file = support::SqliteFactory::fresh();
    let (a, b) = (connect(&file).await, connect(&file).await);
    let ttl = Duration::from_secs(60);
    let n = name("forged");
    let lease = grant(&a, &n, ttl).await;
    let presence = presence_of(file.path(), &lease);
    for ((what, forged), via) in forgeries(&lease)
        .into_iter()
        .flat_map(|f| [(f.clone(), "its own client"), (f, "another client")])
    {
        let client = if via == "its own client" { &a } else { &b };
        assert_eq!(
            client.release(&forged).await.unwrap(),
            ReleaseOutcome::NotHeld,
            "{what} through {via}"
        );
        assert!(
            b.try_acquire_for(&n, ttl)
                .await
                .unwrap()
                .into_lease()
                .is_none(),
            "after the release of {what} through {via}, another client took the lock"
        );
        assert!(
            presence.exists(),
            "the release of {what} through {via} removed the holder's presence file"
        );
    }
    assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::Released);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The presence file of `lease`'s grant in lock file `file`
/// (`<file>-distlock/FENCE`), which exists while the grant counts.
fn presence_of(file: &Path, lease: &Lease) -> PathBuf {
    let presence =
        PathBuf::from(format!("{}-distlock", file.display())).join(lease.fence().get().to_string());
    assert!(
        presence.exists(),
        "no presence file at {}",
        presence.display()
    );
    presence
}

/// An eviction names its holder by fence: another fence evicts nothing; the
/// named one loses its row, and its holder, in another client, hears of it
/// at once through its presence file's removal.
#[tokio::test]
async fn an_eviction_takes_only_the_named_holder_and_tells_it_at_once() {
    let file = support::SqliteFactory::fresh();
    let (a, b) = (connect(&file).await, connect(&file).await);
    let n = name("evicted");
    let lease = grant(&a, &n, Duration::from_secs(60)).await;
    let presence = presence_of(file.path(), &lease);
    let other = FencingToken::new(lease.fence().get() + 1).unwrap();
    assert_eq!(b.evict(&n, Some(other)).await.unwrap(), None);
    assert!(
        b.inspect(&n).await.unwrap().is_some(),
        "another fence evicted it"
    );
    let evicted = b.evict(&n, Some(lease.fence())).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    assert!(b.inspect(&n).await.unwrap().is_none());
    let lost = lease
        .loss_signal()
        .expect("a grant carries its loss signal");
    tokio::time::timeout(scaled(Duration::from_secs(1)), lost.cancelled())
        .await
        .expect("the evicted holder was not told");
    assert!(
        !presence.exists(),
        "the evicted grant's presence file is left"
    );
    assert_eq!(b.evict(&n, None).await.unwrap(), None, "evicted twice");
    assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::NotHeld);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Grants `n` for 50 ms on `backend` and waits until its row expired on the
/// boot clock; returns the grant's presence file.
async fn expired_grant(backend: &SqliteBackend, file: &Path, n: &LockName) -> PathBuf {
    let lease = grant(backend, n, Duration::from_millis(50)).await;
    let presence = presence_of(file, &lease);
    poll::until(
        scaled(Duration::from_secs(5)),
        "the row expires",
        || async { backend.inspect(n).await.unwrap().is_none() },
    )
    .await;
    presence
}

/// A grant that replaces an expired holder removes that holder's presence
/// file: its removal is what tells the holder, if it still runs (paused),
/// that the lock is gone, and nothing of the old grant is left behind.
#[tokio::test]
async fn a_takeover_of_an_expired_row_removes_its_presence_file() {
    let file = support::SqliteFactory::fresh();
    let (a, b) = (connect(&file).await, connect(&file).await);
    let n = name("taken-over");
    let presence = expired_grant(&a, file.path(), &n).await;
    let lease = b
        .try_acquire_for(&n, Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .expect("an expired row is free");
    assert!(
        !presence.exists(),
        "the expired holder's presence file is left behind"
    );
    b.release(&lease).await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A client's next grant forgets its grants whose rows expired: it stops
/// watching their presence files (no inotify watch kept for a grant that
/// no longer counts).
#[tokio::test]
async fn a_grant_stops_watching_the_clients_expired_grants() {
    let file = support::SqliteFactory::fresh();
    let backend = connect(&file).await;
    let presence = expired_grant(&backend, file.path(), &name("expired")).await;
    assert_eq!(
        inotify_watching(watch_id(&presence)).len(),
        1,
        "the client watches its grant's presence file"
    );
    let lease = grant(&backend, &name("next"), Duration::from_secs(60)).await;
    assert!(presence.exists(), "nobody took the expired grant over");
    assert_eq!(
        inotify_watching(watch_id(&presence)),
        Vec::<i32>::new(),
        "the expired grant's presence file is still watched"
    );
    backend.release(&lease).await.unwrap();
    backend.close().await.unwrap();
}

/// A renewal moves the client's record of its grant to the new expiry: the
/// grant stays watched (an eviction of it is still heard at once) after the
/// expiry it was granted with has passed.
#[tokio::test]
async fn a_renewed_grant_stays_watched_past_its_first_expiry() {
    let file = support::SqliteFactory::fresh();
    let backend = connect(&file).await;
    let n = name("renewed");
    let lease = grant(&backend, &n, Duration::from_millis(50)).await;
    let presence = presence_of(file.path(), &lease);
    // The same grant renewed for a minute (a renewal takes its lease's TTL).
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(60))
        .unwrap();
    let longer = Lease::new(n.clone(), lease.owner(), lease.fence(), ttl, Moment::now());
    let renewed = backend.renew(&longer).await.unwrap();
    // Past the first expiry; the next grant forgets what expired by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let next = grant(&backend, &name("next"), Duration::from_secs(60)).await;
    assert!(
        backend.inspect(&n).await.unwrap().is_some(),
        "the renewal did not count"
    );
    assert_eq!(
        inotify_watching(watch_id(&presence)).len(),
        1,
        "the renewed grant's presence file is no longer watched"
    );
    backend.release(&renewed).await.unwrap();
    backend.release(&next).await.unwrap();
    backend.close().await.unwrap();
}
