//! Leases are stamped on the clock they are judged on: a grant with the
//! request's clock, read before the request leaves; a renewal with the
//! lease's own clock, read before the renewal leaves, each lease of a batch
//! on its own clock. A clock whose boot reading no real clock gives tells
//! whose reading a lease carries.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::stores::redis as launcher;
use lock_redis::RedisBackend;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{Clock, LockRequest, Moment};
use lockcore::{Lease, LockBackend, LockName};
use tokio::time::Instant;

/// The real monotonic clock, and a boot clock stopped at `boot`: a reading
/// of this clock is told apart from any other by its boot part.
#[derive(Debug)]
struct Marked {
    boot: Duration,
}

impl Clock for Marked {
    fn now(&self) -> Moment {
        Moment::from_parts(Instant::now(), Some(self.boot))
    }
}

fn marked(secs: u64) -> Arc<dyn Clock> {
    Arc::new(Marked {
        boot: Duration::from_secs(secs),
    })
}

fn request(backend: &RedisBackend, name: &LockName, clock: &Arc<dyn Clock>) -> LockRequest {
    LockRequest::new(
        name.clone(),
        backend.capabilities().effective_ttl(LONG).unwrap(),
    )
    .with_clock(clock.clone())
}

/// `lease` was stamped by `clock` between `before` and `after`, and is
/// judged on it.
fn stamped_by(lease: &Lease, secs: u64, before: Instant, after: Instant, what: &str) {
    let issued = lease.issued();
    assert_eq!(
        issued.boot(),
        Some(Duration::from_secs(secs)),
        "{what}: stamped on another clock"
    );
    assert!(
        before <= issued.mono() && issued.mono() <= after,
        "{what}: stamped outside its round trip"
    );
    assert_eq!(
        lease.now().boot(),
        Some(Duration::from_secs(secs)),
        "{what}: judged on another clock"
    );
}

/// A lock taken at once, a lock taken by a waiting acquire, and a permit:
/// each lease carries a reading of its request's clock, taken within its
/// round trip; `renew` and `renew_many` stamp each lease on its own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_renewals_are_stamped_on_the_leases_clock() {
    let backend = RedisBackend::connect(&launcher::shared().url())
        .await
        .unwrap();
    let (a, b, c) = (marked(7), marked(11), marked(13));

    let before = Instant::now();
    let lock = backend
        .try_acquire(&request(&backend, &unique("clock-lock"), &a))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    stamped_by(&lock, 7, before, Instant::now(), "try_acquire");

    let before = Instant::now();
    let wait = WaitPolicy::new(Instant::now() + LONG);
    let waited = backend
        .acquire(&request(&backend, &unique("clock-wait"), &b), &wait)
        .await
        .unwrap()
        .unwrap();
    stamped_by(&waited, 11, before, Instant::now(), "acquire");

    let before = Instant::now();
    let permit = backend
        .try_acquire_permit(&request(&backend, &unique("clock-permit"), &c), 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    stamped_by(&permit, 13, before, Instant::now(), "try_acquire_permit");

    let before = Instant::now();
    let renewed = backend.renew(&lock).await.unwrap();
    stamped_by(&renewed, 7, before, Instant::now(), "renew");

    let before = Instant::now();
    let batch = backend
        .renew_many(&[lock.clone(), waited.clone(), permit.clone()])
        .await;
    let after = Instant::now();
    let renewed: Vec<Lease> = batch.into_iter().map(Result::unwrap).collect();
    stamped_by(&renewed[0], 7, before, after, "renew_many, lock");
    stamped_by(&renewed[1], 11, before, after, "renew_many, waited");
    stamped_by(&renewed[2], 13, before, after, "renew_many, permit");

    for lease in [lock, waited, permit] {
        backend.release(&lease).await.unwrap();
    }
}
