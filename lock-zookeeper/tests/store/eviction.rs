//! Forced release (`evict`): compare-and-evict, and how soon the evicted
//! holder hears of it.

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Attempt, FencingToken, LockBackend, ReleaseOutcome};
use rand::Rng;
use tokio::time::{Instant, timeout};

use crate::support::{children, connect, locker, raw, round_trip, short_lived, take, unique};

/// A holder's loss signal fires within the declared eviction notice (plus a
/// round trip) of a forced release, whether the release comes before its
/// session started watching the node or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_reaches_the_holder_within_the_declared_notice() {
    let store = zookeeper::shared();
    let holder = crate::support::connect(store.endpoint()).await.unwrap();
    let admin = crate::support::connect(store.endpoint()).await.unwrap();
    let notice = holder
        .capabilities()
        .eviction_notice
        .expect("the holder is told of a forced release: eviction_notice is declared");
    let bound = notice + round_trip(&admin).await;
    let mut heard = Vec::new();
    for _ in 0..24 {
        let name = unique("evict-notice");
        let lease = take(&holder, &name).await;
        let lost = lease.loss_signal().expect("a loss signal").clone();
        tokio::time::sleep(notice.mul_f64(rand::rng().random_range(0.0..2.0))).await;
        let evicted = admin.evict(&name, Some(lease.fence())).await.unwrap();
        assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
        let at = Instant::now();
        tokio::time::timeout(bound, lost.cancelled())
            .await
            .unwrap_or_else(|_| panic!("not told of the forced release within {bound:?}"));
        heard.push(at.elapsed());
        assert_eq!(
            holder.release(&lease).await.unwrap(),
            ReleaseOutcome::NotHeld
        );
    }
    heard.sort();
    eprintln!(
        "eviction heard after: min {:?}, median {:?}, max {:?} (notice {notice:?}, bound {bound:?}, {} runs)",
        heard[0],
        heard[heard.len() / 2],
        heard[heard.len() - 1],
        heard.len()
    );
}

/// `evict(name, Some(fence))` evicts only the grant with that fence: a
/// wrong fence evicts nothing, and a retried eviction of a grant that is
/// gone leaves the next holder alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_with_a_fence_evicts_that_grant_only() {
    let store = zookeeper::shared();
    let first = crate::support::connect(store.endpoint()).await.unwrap();
    let next = crate::support::connect(store.endpoint()).await.unwrap();
    let admin = crate::support::connect(store.endpoint()).await.unwrap();
    let name = unique("evict-fence");
    let lease = take(&first, &name).await;
    let waiting = tokio::spawn({
        let (next, name) = (next.clone(), name.clone());
        let policy = WaitPolicy::new(Instant::now() + Duration::from_secs(30));
        async move {
            next.acquire_for(&name, next.session_timeout(), &policy)
                .await
        }
    });
    let parent = admin.lock_path(&name);
    let observer = crate::support::raw(&store.endpoint()).await;
    lock_conformance::kit::poll::until(Duration::from_secs(10), "the waiter queueing", || async {
        crate::support::children(&observer, &parent).await.len() == 2
    })
    .await;

    let wrong = FencingToken::new(lease.fence().get() + 1).unwrap();
    assert_eq!(admin.evict(&name, Some(wrong)).await.unwrap(), None);
    let holder = admin.inspect(&name).await.unwrap().map(|h| h.fence);
    assert_eq!(
        holder,
        Some(lease.fence()),
        "a wrong fence evicted the holder"
    );
    let lease = first.renew(&lease).await.unwrap();

    let evicted = admin.evict(&name, Some(lease.fence())).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    let granted = waiting.await.unwrap().unwrap().expect("the waiter is next");
    assert!(granted.fence() > lease.fence());

    // The operator's retry of the same eviction.
    assert_eq!(admin.evict(&name, Some(lease.fence())).await.unwrap(), None);
    let holder = admin.inspect(&name).await.unwrap().map(|h| h.fence);
    assert_eq!(
        holder,
        Some(granted.fence()),
        "a retried eviction evicted the next holder"
    );
    let granted = next.renew(&granted).await.unwrap();
    assert!(first.renew(&lease).await.is_err());

    let evicted = admin.evict(&name, None).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(granted.fence()));
    assert_eq!(admin.inspect(&name).await.unwrap(), None);
}

/// Releasing a lease is no loss: the server sends the deletion event of
/// the holder's watched node before the delete's reply, and that event must
/// not fire the lease's loss signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_does_not_fire_the_loss_signal() {
    let store = zookeeper::shared();
    let holder = crate::support::connect(store.endpoint()).await.unwrap();
    // Long after the session starts watching a grant (a sixteenth of it).
    let watched = holder.session_timeout() / 8;
    let settle = round_trip(&holder).await;
    for _ in 0..10 {
        let name = unique("release-quiet");
        let lease = take(&holder, &name).await;
        let lost = lease.loss_signal().unwrap().clone();
        tokio::time::sleep(watched).await;
        assert_eq!(
            holder.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
        let fired = tokio::time::timeout(settle, lost.cancelled()).await;
        assert!(fired.is_err(), "releasing {name} fired its loss signal");
    }
}

/// Renewing a batch costs one `sync` and proves each watched lease by its
/// node's watch: a lease whose node was force-released is refused in the
/// batch that renews the others, right after the eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_refuses_the_evicted_lease_and_renews_the_rest() {
    let store = zookeeper::shared();
    let holder = crate::support::connect(store.endpoint()).await.unwrap();
    let admin = crate::support::connect(store.endpoint()).await.unwrap();
    let notice = holder.capabilities().eviction_notice.unwrap();
    for _ in 0..8 {
        let names = [unique("batch-a"), unique("batch-b"), unique("batch-c")];
        let mut leases = Vec::new();
        for name in &names {
            leases.push(take(&holder, name).await);
        }
        // Past the notice every node is watched: renewals need no reads.
        tokio::time::sleep(notice).await;
        let victim = rand::rng().random_range(0..names.len());
        let evicted = admin
            .evict(&names[victim], Some(leases[victim].fence()))
            .await
            .unwrap();
        assert!(evicted.is_some());
        let renewed = holder.renew_many(&leases).await;
        for (i, outcome) in renewed.iter().enumerate() {
            match outcome {
                Err(lockcore::LockError::NotHeld { .. }) if i == victim => {}
                Ok(lease) if i != victim => assert_eq!(lease.fence(), leases[i].fence()),
                other => panic!("lease {i} (evicted: {victim}): {other:?}"),
            }
        }
        for (i, lease) in leases.iter().enumerate() {
            let released = holder.release(lease).await.unwrap();
            assert_eq!(released == ReleaseOutcome::Released, i != victim);
        }
    }
}

/// A write to a held node (possible without digest credentials) is no
/// eviction: the node's watch fires, but renewals read the node and go on,
/// and the loss signal stays quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_held_node_is_no_eviction() {
    let store = zookeeper::shared();
    let holder = crate::support::connect(store.endpoint()).await.unwrap();
    let writer = crate::support::raw(&store.endpoint()).await;
    let notice = holder.capabilities().eviction_notice.unwrap();
    for _ in 0..24 {
        let name = unique("written");
        let lease = take(&holder, &name).await;
        // Past the notice the node is watched.
        tokio::time::sleep(notice).await;
        let parent = holder.lock_path(&name);
        let node = crate::support::children(&writer, &parent).await.remove(0);
        // The write lands while the renewal's sync is on its way (or just
        // before): its event reaches the renewal's check of the watch.
        let path = format!("{parent}/{node}");
        let (written, renewed) = tokio::join!(
            writer.set_data(&path, b"scribble", None),
            holder.renew_many(std::slice::from_ref(&lease)),
        );
        written.unwrap();
        let renewed = renewed.into_iter().next().unwrap().expect("still held");
        assert!(!lease.loss_signal().unwrap().is_cancelled());
        assert_eq!(
            holder.release(&renewed).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

/// `inspect` and `force_release` see the holder, not a waiter; the forced
/// release deletes exactly the holder's node, the waiter gets the lock
/// next, and the evicted guard learns from its node watch (or, in the
/// first moments of a grant, its next renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_evicts_the_head_and_the_queue_moves_on() {
    let store = zookeeper::shared();
    let (a, b, admin) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("forced");
    let guard = locker(&a).acquire(&name).await.unwrap();
    let waiter = tokio::spawn({
        let (locker, name) = (locker(&b), name.clone());
        async move { locker.acquire(&name).await }
    });
    let parent = a.lock_path(&name);
    eventually(Duration::from_secs(2), "the waiter queueing", || async {
        (children(&observer, &parent).await.len() == 2).then_some(())
    })
    .await;
    let holder = admin.inspect(&name).await.unwrap().unwrap();
    assert_eq!(holder.fence, guard.fencing_token());
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    let evicted = admin.evict(&name, None).await.unwrap().unwrap();
    assert_eq!(evicted.fence, guard.fencing_token());
    let evicted_at = Instant::now();
    let within = a.session_timeout() / 3 + Duration::from_millis(500);
    timeout(within, guard.lost())
        .await
        .expect("the evicted guard learns by its node watch or its next renewal");
    assert!(evicted_at.elapsed() < within);
    let guard_b = timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(guard_b.fencing_token() > evicted.fence);
    assert!(matches!(
        a.try_acquire_for(&name, a.session_timeout()).await.unwrap(),
        Attempt::Held { .. }
    ));
    guard_b.release().await.unwrap();
}

/// The watch that tells a holder of a forced release outlives the lease's
/// first deadlines: renewed past several of them, then evicted, the holder
/// is told within the declared notice (plus a round trip), not only at its
/// next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_after_renewals_reaches_the_holder_within_the_notice() {
    let store = zookeeper::shared();
    let holder = connect(store.endpoint()).await.unwrap();
    let admin = connect(store.endpoint()).await.unwrap();
    let notice = holder.capabilities().eviction_notice.unwrap();
    let bound = notice + round_trip(&admin).await;
    let name = unique("evict-after-renewals");
    // Each deadline a few notices away: several pass while it is renewed.
    let left = (notice * 4).max(scaled(Duration::from_millis(500)));
    let mut lease = short_lived(&holder, &name, left).await;
    let first = lease.deadline();
    while Instant::now() < first + left {
        tokio::time::sleep(left / 4).await;
        lease = holder.renew(&lease).await.unwrap();
    }
    let lost = lease.loss_signal().expect("a loss signal").clone();
    let evicted = admin.evict(&name, Some(lease.fence())).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    timeout(bound, lost.cancelled())
        .await
        .unwrap_or_else(|_| panic!("not told of the forced release within {bound:?}"));
}
