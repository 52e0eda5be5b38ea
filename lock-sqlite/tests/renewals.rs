//! Leases and their renewals: a batch renewal renews each lease only on
//! its own grant's row (kind, name, slot, owner and fence, not the fence
//! alone), and every lease is stamped on the clock of the request that
//! granted it, its renewals on the lease's own clock, read before the
//! request leaves.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::{Clock, LockBackendExt, LockRequest, Moment};
use lockcore::{Lease, LockBackend, LockError, LockName, OwnerToken};

fn name(n: &str) -> LockName {
    LockName::new(n).unwrap()
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

/// The system clocks, with the boot clock `ahead` of the real one (a host
/// that was suspended for that long, as this clock's reader sees it).
#[derive(Debug, Default)]
struct Ahead {
    ahead: Mutex<Duration>,
}

impl Ahead {
    fn jump(&self, d: Duration) {
        *self.ahead.lock().unwrap() += d;
    }
}

impl Clock for Ahead {
    fn now(&self) -> Moment {
        let real = Moment::now();
        let ahead = *self.ahead.lock().unwrap();
        Moment::from_parts(real.mono(), real.boot().map(|b| b + ahead))
    }
}

#[tokio::test]
async fn leases_are_stamped_and_judged_on_their_own_clock() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(60);
    let clock = Arc::new(Ahead::default());
    clock.jump(Duration::from_secs(1_000));
    let request = LockRequest::new(
        name("clocked"),
        backend.capabilities().effective_ttl(ttl).unwrap(),
    )
    .with_clock(clock.clone());

    let before = clock.now();
    let lease = backend
        .try_acquire(&request)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    assert!(
        Arc::ptr_eq(lease.clock(), &dyn_clock),
        "the lease is judged on another clock than its request's"
    );
    assert!(
        lease.issued().boot() >= before.boot() && lease.issued().mono() >= before.mono(),
        "the grant was stamped {:?}, before the request's clock read {:?}",
        lease.issued(),
        before
    );
    // The host sleeps half the TTL: the lease counts it.
    clock.jump(ttl / 2);
    assert!(lease.remaining() <= ttl / 2, "{:?} left", lease.remaining());

    // A renewal is stamped on the lease's clock, read before it is sent.
    let before = clock.now();
    let renewed = backend.renew(&lease).await.unwrap();
    assert!(
        renewed.issued().boot() >= before.boot(),
        "the renewal was stamped {:?}, before the lease's clock read {:?}",
        renewed.issued(),
        before
    );
    assert!(Arc::ptr_eq(renewed.clock(), &dyn_clock));
    assert!(renewed.remaining() > ttl / 2 && renewed.remaining() <= ttl);
    backend.release(&renewed).await.unwrap();
    backend.close().await.unwrap();
}

#[tokio::test]
async fn a_request_on_the_system_clock_keeps_it() {
    let file = support::SqliteFactory::fresh();
    let backend = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let lease = backend
        .try_acquire_for(&name("plain"), Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(lease.remaining() > Duration::from_secs(58));
    backend.release(&lease).await.unwrap();
    backend.close().await.unwrap();
}
