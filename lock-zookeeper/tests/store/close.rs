//! Closing a client: what it held and what it queued for is gone from the
//! store by the time `close` returns (its session is closed, so ZooKeeper
//! deletes its nodes at once), every lease it granted is lost, and it
//! refuses work afterwards. Dropping the last handle of a client does the
//! same in the background.

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::ZooKeeperBackend;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Lease, LockBackend, LockError, LockName};
use tokio::time::Instant;

use crate::support::{children, connect, locker, raw, round_trip, session_id, take, unique};

/// The nodes of session `sid` under `parents` (each a queue), as the server
/// sees them.
async fn nodes_of(
    observer: &lock_zookeeper::zk::Client,
    sid: i64,
    parents: &[String],
) -> Vec<String> {
    let mut owned = Vec::new();
    for parent in parents {
        for child in children(observer, parent).await {
            let path = format!("{parent}/{child}");
            if let Ok(Some(stat)) = observer.check_stat(&path).await
                && stat.ephemeral_owner == sid
            {
                owned.push(path);
            }
        }
    }
    owned
}

/// The node of semaphore `name` (`<root>/%permits/<segment>`).
fn semaphore_path(backend: &ZooKeeperBackend, name: &LockName) -> String {
    let path = backend.lock_path(name);
    let (root, segment) = path.rsplit_once('/').unwrap();
    format!("{root}/%permits/{segment}")
}

fn unavailable<T: std::fmt::Debug>(what: &str, outcome: Result<T, LockError>) {
    assert!(
        matches!(outcome, Err(LockError::Unavailable { .. })),
        "{what} on a closed client: {outcome:?}"
    );
}

/// A client holds a lock and a permit, and a waiter of it times out (or
/// its acquire future is dropped) behind another client's holder; the
/// client is closed right away, as a process that exits. By the time
/// `close` returns, the store holds nothing of it (its session is closed on
/// the server: `cons` lists no connection of it), both leases' loss signals
/// fired, the other client takes the freed names at once and is next in
/// the queue it holds; every later call of the closed client is
/// `Unavailable`, and closing again is harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_leaves_nothing_in_the_store_and_refuses_later_calls() {
    let store = zookeeper::shared();
    let observer = raw(&store.endpoint()).await;
    for gives_up in ["times out", "is dropped"] {
        let (a, b) = (
            connect(store.endpoint()).await.unwrap(),
            connect(store.endpoint()).await.unwrap(),
        );
        let (held, waited, permits) = (
            unique("close-held"),
            unique("close-waited"),
            unique("close-permits"),
        );
        let lease = take(&a, &held).await;
        let request = LockRequest::new(permits.clone(), lease.ttl());
        let permit = a
            .try_acquire_permit(&request, 2)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        let holder = take(&b, &waited).await;
        let wait = scaled(Duration::from_millis(300));
        match gives_up {
            "times out" => {
                let outcome = locker(&a).acquire_timeout(&waited, wait).await;
                assert!(
                    matches!(outcome, Err(LockError::Timeout { .. })),
                    "{outcome:?}"
                );
            }
            _ => {
                let waiting = locker(&a);
                let outcome = tokio::time::timeout(wait, waiting.acquire(&waited)).await;
                assert!(outcome.is_err(), "the acquire should still be waiting");
            }
        }
        let sid = session_id(&a);
        let parents: Vec<String> = [&held, &waited]
            .iter()
            .map(|n| a.lock_path(n))
            .chain((0..2).map(|k| format!("{}/{k}", semaphore_path(&a, &permits))))
            .collect();
        assert!(!nodes_of(&observer, sid, &parents).await.is_empty());

        let started = Instant::now();
        a.close().await.unwrap();
        let took = started.elapsed();
        eprintln!("{gives_up}: closed in {took:?}");
        assert_eq!(
            nodes_of(&observer, sid, &parents).await,
            Vec::<String>::new(),
            "{gives_up}: nodes of the closed session are left"
        );
        assert!(
            crate::support::connections(store.addr(), sid).is_empty(),
            "{gives_up}: the closed session still has a connection"
        );
        for lost in [&lease, &permit] {
            assert!(
                lost.loss_signal().is_some_and(|s| s.is_cancelled()) && lost.is_expired(),
                "{gives_up}: a lease of the closed client reads held"
            );
        }
        assert_eq!(
            children(&observer, &a.lock_path(&waited)).await.len(),
            1,
            "{gives_up}: only the holder is queued"
        );
        let next = take(&b, &held).await;
        b.release(&next).await.unwrap();
        b.release(&holder).await.unwrap();

        unavailable(
            "try_acquire",
            a.try_acquire_for(&unique("after"), lease.ttl().get()).await,
        );
        unavailable("renew", a.renew(&lease).await);
        unavailable("release", a.release(&lease).await);
        unavailable("inspect", a.inspect(&held).await);
        unavailable("client", a.client());
        unavailable("acquire", locker(&a).acquire_timeout(&held, wait).await);
        a.close().await.unwrap();
    }
}

/// The last handle of a client is dropped while it holds a lock (a raw
/// lease, kept): the lease's loss signal fires at once (nobody can renew or
/// release it any more), and the session is closed in the background, so
/// the name is free within a few round trips, not at the lease's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_loses_its_leases_and_frees_its_names() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let rtt = round_trip(&b).await;
    let name = unique("dropped");
    let lease: Lease = take(&a, &name).await;
    let (sid, path) = (session_id(&a), a.lock_path(&name));
    drop(a);
    assert!(lease.is_expired(), "a lease of a dropped client reads held");
    let started = Instant::now();
    let next = eventually(rtt * 10, "the dropped client's name is free", || async {
        b.try_acquire_for(&name, lease.ttl().get())
            .await
            .unwrap()
            .into_lease()
    })
    .await;
    eprintln!("free {:?} after the drop", started.elapsed());
    assert!(next.fence() > lease.fence());
    assert!(crate::support::connections(store.addr(), sid).is_empty());
    let observer = raw(&store.endpoint()).await;
    assert_eq!(
        nodes_of(&observer, sid, &[path]).await,
        Vec::<String>::new()
    );
    b.release(&next).await.unwrap();
}

/// A handle from `client()` that is still kept holds the session open:
/// `close` gives up at its limit, saying so, and the session closes once
/// the handle is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_says_when_a_kept_handle_holds_the_session() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let name: LockName = unique("kept-handle");
    let _lease = take(&a, &name).await;
    let kept = a.client().unwrap();
    let sid = session_id(&a);
    let started = Instant::now();
    let e = a.close().await.unwrap_err();
    eprintln!("close gave up after {:?}: {e}", started.elapsed());
    assert!(e.to_string().contains("client()"), "{e}");
    drop(kept);
    let observer = raw(&store.endpoint()).await;
    let path = a.lock_path(&name);
    eventually(
        scaled(Duration::from_secs(2)),
        "the session closing",
        || async {
            nodes_of(&observer, sid, std::slice::from_ref(&path))
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
}

/// Waits in progress when their client is closed (for a lock and for a
/// permit) end at once, `Unavailable`, rather than retrying until their
/// deadline; their queue node goes with the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_in_progress_end_when_their_client_is_closed() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let rtt = round_trip(&b).await;
    let (name, permits) = (unique("close-waiting"), unique("close-waiting-permits"));
    let holder = take(&b, &name).await;
    let request = LockRequest::new(permits.clone(), holder.ttl());
    let permit = b
        .try_acquire_permit(&request, 1)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let lock_wait = tokio::spawn({
        let (locker, name) = (locker(&a), name.clone());
        async move { locker.acquire(&name).await.map(|_| ()) }
    });
    let permit_wait = tokio::spawn({
        let semaphore = locker(&a).semaphore(permits.clone(), 1).unwrap();
        async move { semaphore.acquire().await.map(|_| ()) }
    });
    let observer = raw(&store.endpoint()).await;
    let parent = a.lock_path(&name);
    eventually(rtt * 10, "the lock waiter queueing", || async {
        (children(&observer, &parent).await.len() == 2).then_some(())
    })
    .await;
    a.close().await.unwrap();
    let closed = Instant::now();
    for (what, wait) in [("lock", lock_wait), ("permit", permit_wait)] {
        let outcome = tokio::time::timeout(rtt * 10, wait)
            .await
            .unwrap_or_else(|_| panic!("the {what} wait outlived its client"))
            .unwrap();
        unavailable(what, outcome);
    }
    eprintln!("waits ended {:?} after the close", closed.elapsed());
    assert_eq!(children(&observer, &parent).await.len(), 1);
    b.release(&holder).await.unwrap();
    b.release(&permit).await.unwrap();
}
