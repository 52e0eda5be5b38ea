//! Leases are stamped on the clock of the request that asked for them, read
//! before the request leaves, and renewals on the lease's own clock: a
//! locker with its own clock (a test's, whose boot clock reads as if the
//! host had slept) gets leases judged on that clock, never on one rebuilt
//! from the system's.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{backend, lock_name, shared_url};
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{Clock, LockRequest, Moment};
use lockcore::{Lease, LockBackend, LockName};
use tokio::time::Instant;

/// How far ahead the test clock's boot reading runs.
const AHEAD: Duration = Duration::from_secs(1_000);

/// The system clocks, with the boot clock `AHEAD` further on (as after a
/// long suspend), and every reading counted.
#[derive(Debug, Default)]
struct Ahead {
    reads: std::sync::atomic::AtomicUsize,
}

impl Clock for Ahead {
    fn now(&self) -> Moment {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = Moment::now();
        Moment::from_parts(now.mono(), now.boot().map(|boot| boot + AHEAD))
    }
}

impl Ahead {
    fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Whether `lease` was stamped on the `Ahead` clock (its boot reading is
/// ahead of the system's by about `AHEAD`), and is judged on it.
fn stamped_ahead(lease: &Lease, clock: &Arc<dyn Clock>) -> bool {
    let (Some(stamped), Some(system)) = (lease.issued().boot(), Moment::now().boot()) else {
        return true; // no boot clock here: nothing to tell apart
    };
    stamped > system + AHEAD / 2 && Arc::ptr_eq(lease.clock(), clock)
}

fn request(name: &LockName, clock: &Arc<dyn Clock>) -> LockRequest {
    let ttl = lockcore::Capabilities::new("postgres")
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    LockRequest::new(name.clone(), ttl).with_clock(clock.clone())
}

#[tokio::test]
async fn leases_are_stamped_and_renewed_on_their_own_clock() {
    let client = backend(&shared_url()).await;
    let ahead = Arc::new(Ahead::default());
    let clock: Arc<dyn Clock> = ahead.clone();

    let lock = client
        .try_acquire(&request(&lock_name("try"), &clock))
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    assert!(
        stamped_ahead(&lock, &clock),
        "try_acquire: {:?}",
        lock.issued()
    );
    let waited = client
        .acquire(
            &request(&lock_name("wait"), &clock),
            &WaitPolicy::new(Instant::now() + Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .expect("free");
    assert!(
        stamped_ahead(&waited, &clock),
        "acquire: {:?}",
        waited.issued()
    );
    let permit = client
        .try_acquire_permit(&request(&lock_name("permit"), &clock), 2)
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    assert!(
        stamped_ahead(&permit, &clock),
        "permit: {:?}",
        permit.issued()
    );

    for lease in [&lock, &permit] {
        let reads = ahead.reads();
        let renewed = client.renew(lease).await.unwrap();
        assert!(ahead.reads() > reads, "the renewal read the lease's clock");
        assert!(
            stamped_ahead(&renewed, &clock),
            "renew: {:?}",
            renewed.issued()
        );
    }
    // A batch of leases on two clocks: each renewal on its own lease's.
    let system = client
        .try_acquire(&request(
            &lock_name("system"),
            &(Arc::new(lockcore::backend::SystemClock) as Arc<dyn Clock>),
        ))
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    let batch = client
        .renew_many(&[lock.clone(), system.clone(), permit.clone()])
        .await;
    let batch: Vec<Lease> = batch.into_iter().map(Result::unwrap).collect();
    assert!(
        stamped_ahead(&batch[0], &clock),
        "renew_many: {:?}",
        batch[0].issued()
    );
    assert!(
        !stamped_ahead(&batch[1], &clock),
        "renew_many: {:?}",
        batch[1].issued()
    );
    assert!(
        stamped_ahead(&batch[2], &clock),
        "renew_many: {:?}",
        batch[2].issued()
    );
    for lease in [lock, waited, permit, system] {
        client.release(&lease).await.unwrap();
    }
}
