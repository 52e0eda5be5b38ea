//! Semaphores on the wire: the semaphore node holds its permit count, each
//! slot is a lock queue of its own, the count may change once nobody holds
//! a permit, and a cut-off holder's slot is free within TTL + slack.

use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::ZooKeeperBackend;
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{HolderLabel, Lease, LockBackend, LockError, LockName, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::{connect, raw, round_trip, unique};

fn request(backend: &ZooKeeperBackend, name: &LockName, label: &str) -> LockRequest {
    let ttl = backend
        .capabilities()
        .effective_ttl(backend.session_timeout())
        .unwrap();
    LockRequest::new(name.clone(), ttl).with_label(HolderLabel::new(label).unwrap())
}

async fn permit(backend: &ZooKeeperBackend, name: &LockName, permits: u32) -> Option<Lease> {
    let request = request(backend, name, "permit taker");
    backend
        .try_acquire_permit(&request, permits)
        .await
        .unwrap()
        .into_lease()
}

/// The semaphore node holds the count; a permit is the head of one slot's
/// queue, labelled, with the fence `inspect_permits` shows; the semaphore
/// is apart from the lock of the same name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_the_head_of_its_slots_queue() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("semaphore-layout");
    let request = request(&a, &name, "worker 7");
    let first = a
        .try_acquire_permit(&request, 3)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let second = a
        .try_acquire_permit(&request, 3)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let lock = crate::support::take(&a, &name).await;

    let root = a.config().root_path().to_owned();
    let semaphore = format!(
        "{root}/%permits/{}",
        a.lock_path(&name).rsplit('/').next().unwrap()
    );
    let (count, _) = observer.get_data(&semaphore).await.unwrap();
    assert_eq!(count, b"3");
    for lease in [&first, &second] {
        let slot = lease.slot().expect("a permit has a slot");
        assert!(slot < 3);
        let nodes = observer
            .list_children(&format!("{semaphore}/{slot}"))
            .await
            .unwrap();
        assert_eq!(nodes.len(), 1, "slot {slot}: {nodes:?}");
        let (data, stat) = observer
            .get_data(&format!("{semaphore}/{slot}/{}", nodes[0]))
            .await
            .unwrap();
        assert_eq!(data, b"worker 7");
        assert_eq!(stat.czxid as u64, lease.fence().get());
    }
    assert_ne!(first.slot(), second.slot());
    let mut holders = a.inspect_permits(&name).await.unwrap();
    holders.sort_by_key(|h| h.slot);
    let mut leases = [&first, &second];
    leases.sort_by_key(|l| l.slot());
    for (holder, lease) in holders.iter().zip(leases) {
        assert_eq!((holder.slot, holder.fence), (lease.slot(), lease.fence()));
        assert_eq!(holder.owner, Some(lease.owner()));
        assert_eq!(holder.label.as_ref().map(|l| l.as_str()), Some("worker 7"));
    }
    assert_eq!(holders.len(), 2);
    // The lock of the same name is another thing.
    assert_eq!(
        a.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(lock.fence())
    );
    for lease in [&first, &second, &lock] {
        assert_eq!(a.release(lease).await.unwrap(), ReleaseOutcome::Released);
    }
    assert!(a.inspect_permits(&name).await.unwrap().is_empty());
}

/// Once nobody holds a permit, a request with another count starts the
/// semaphore over with it; while one is held, it is refused, and nothing
/// is left behind by the refused request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_changes_only_when_no_permit_is_held() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let name = unique("semaphore-count");
    let two = permit(&a, &name, 2).await.unwrap();
    assert_eq!(a.release(&two).await.unwrap(), ReleaseOutcome::Released);
    // Nobody holds a permit: three it is now.
    let mut three = Vec::new();
    for _ in 0..3 {
        three.push(permit(&b, &name, 3).await.expect("three permits"));
    }
    assert!(permit(&b, &name, 3).await.is_none(), "a fourth of three");
    let refused = a.try_acquire_permit(&request(&a, &name, "late"), 2).await;
    assert!(
        matches!(
            refused,
            Err(LockError::PermitsMismatch {
                requested: 2,
                existing: 3,
                ..
            })
        ),
        "{refused:?}"
    );
    for lease in &three {
        b.release(lease).await.unwrap();
    }
    let again = permit(&a, &name, 2).await.expect("two permits again");
    a.release(&again).await.unwrap();
}

/// A permit holder cut off from the servers loses its session; its slot is
/// granted again (with a larger fence) no earlier than its local deadline
/// and within TTL + the declared slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holders_slot_is_free_within_ttl_and_slack() {
    let store = zookeeper::shared();
    let link = FaultProxy::start(store.addr()).await.unwrap();
    let holder = connect(link.addr().to_string()).await.unwrap();
    let other = connect(store.endpoint()).await.unwrap();
    let name = unique("semaphore-cut");
    let held = permit(&holder, &name, 1).await.unwrap();
    link.set(Mode::Blackhole);
    let cut = Instant::now();
    let caps = other.capabilities();
    let bound = held.ttl().get() + caps.expiry_slack;
    let policy = WaitPolicy::new(cut + bound + round_trip(&other).await);
    let next = other
        .acquire_permit(&request(&other, &name, "next"), 1, &policy)
        .await
        .unwrap()
        .expect("the slot within TTL + slack");
    let freed = cut.elapsed();
    assert!(
        Instant::now() >= held.deadline(),
        "granted before the holder's deadline"
    );
    assert_eq!(next.slot(), held.slot());
    assert!(next.fence() > held.fence());
    eprintln!("slot free {freed:?} after the cut (TTL + slack {bound:?})");
    other.release(&next).await.unwrap();
}
