//! The hand-off path, against real etcd servers from the harness: a
//! hand-off costs etcd the holder's delete and nothing else, a cancelled
//! waiter passes its turn on, each client keeps one watch stream that closes
//! when unused, and a waiter whose stream is cut rejoins.
//!
//! Waiters here re-check only every 60 s, so only etcd's notifications can
//! move them on time.

use lockcore::backend::Kind;
use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::FaultProxy;
use lock_conformance::kit::stores::etcd;
use lock_etcd::EtcdBackend;
use lock_etcd::etcd_client::{Client, GetOptions};
use lock_etcd::testing::watched;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Lease, LockBackend, LockName, ReleaseOutcome};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::*;

const TTL: Duration = Duration::from_secs(30);

async fn hold(backend: &EtcdBackend, name: &LockName) -> Lease {
    acquire(backend, name, TTL).await
}

fn patient() -> WaitPolicy {
    // Re-checks every 60 s: only etcd's notifications can be on time.
    WaitPolicy::new(Instant::now() + Duration::from_secs(60)).recheck(Duration::from_secs(60))
}

/// A waiter on its own client, reporting its grant.
fn wait_for(
    backend: EtcdBackend,
    name: &LockName,
    tag: usize,
    grants: &mpsc::UnboundedSender<(usize, EtcdBackend, Lease)>,
) -> JoinHandle<()> {
    let (name, grants) = (name.clone(), grants.clone());
    tokio::spawn(async move {
        let lease = backend
            .acquire_for(&name, TTL, &patient())
            .await
            .expect("acquire")
            .expect("granted before the deadline");
        let _ = grants.send((tag, backend, lease));
    })
}

/// Waits until the queue of the lock whose grant is `lease` has `len`
/// entries; returns how many reads that took.
async fn queue_reaches(client: &mut Client, lease: &Lease, len: usize) -> usize {
    let queue = queue_of(lease);
    let reads = std::sync::atomic::AtomicUsize::new(0);
    until(
        Duration::from_secs(20),
        &format!("a queue of {len}"),
        || {
            let (mut client, queue) = (client.clone(), queue.clone());
            reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { queue_len(&mut client, queue).await == len }
        },
    )
    .await;
    reads.into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_costs_etcd_the_release_and_nothing_else() {
    // Every etcd Txn and Range of the run is counted on a private server:
    // each client pays its session's marker and one read of its notices,
    // each waiter its enqueue, one read when it starts following the queue,
    // and its release. Moving up the line and taking the lock cost nothing:
    // no read, no write, no new watch.
    const WAITERS: usize = 6;
    let store = private_etcd().await;
    let url = store.endpoint();
    let mut raw = Client::connect([url.as_str()], None).await.unwrap();
    let holder = connect(&url).await;
    let lock = name("one-write");
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        waiters.push(connect(&url).await);
    }
    let before = metrics(&store).await;

    let first = hold(&holder, &lock).await;
    let (tx, mut grants) = mpsc::unbounded_channel();
    let mut our_reads = 0;
    for (i, waiter) in waiters.into_iter().enumerate() {
        wait_for(waiter, &lock, i, &tx);
        our_reads += queue_reaches(&mut raw, &first, i + 2).await; // arrival order
    }
    let mut fence = first.fence();
    assert_eq!(
        holder.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    for expected in 0..WAITERS {
        let (i, backend, lease) = tokio::time::timeout(Duration::from_secs(10), grants.recv())
            .await
            .expect("the next waiter is granted on the release, not at its 60 s re-check")
            .unwrap();
        assert_eq!(i, expected, "FIFO");
        assert!(lease.fence() > fence, "fences grow");
        fence = lease.fence();
        assert!(grants.try_recv().is_err(), "one grant per release");
        assert_eq!(
            backend.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }

    let after = metrics(&store).await;
    let spent = |method| handled(&after, method) - handled(&before, method);
    let clients = WAITERS + 1;
    // Markers, notice reads (each session's keys and the fence floor), the
    // holder's acquire and release, each waiter's enqueue, its first read
    // of the queue (with the fence floor) and its release.
    let txns = 2 * clients + 2 + 3 * WAITERS;
    // This test's own.
    let ranges = our_reads;
    assert_eq!(
        (spent("Txn"), spent("Range")),
        (txns as f64, ranges as f64),
        "(Txns, Ranges) etcd handled for {WAITERS} hand-offs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_passes_its_turn_on() {
    let url = etcd::shared().endpoint();
    let mut raw = Client::connect([url.as_str()], None).await.unwrap();
    let (holder, a, b) = (
        connect(&url).await,
        connect(&url).await,
        connect(&url).await,
    );
    let lock = name("cancelled");
    let held = hold(&holder, &lock).await;
    let (tx, mut grants) = mpsc::unbounded_channel();
    let waiting_a = wait_for(a, &lock, 0, &tx);
    queue_reaches(&mut raw, &held, 2).await;
    let _waiting_b = wait_for(b, &lock, 1, &tx);
    queue_reaches(&mut raw, &held, 3).await;

    // A gives up (its acquire future is dropped): its entry goes.
    waiting_a.abort();
    queue_reaches(&mut raw, &held, 2).await;
    // B is next, but the holder still holds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(grants.try_recv().is_err(), "B was granted a held lock");
    let view = holder.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(view.fence, held.fence());

    let released = Instant::now();
    holder.release(&held).await.unwrap();
    let (i, b, lease) = tokio::time::timeout(scaled(Duration::from_secs(5)), grants.recv())
        .await
        .expect("B is granted on the release, not at its 60 s re-check")
        .unwrap();
    assert_eq!(i, 1);
    assert!(released.elapsed() < scaled(Duration::from_secs(2)));
    assert!(lease.fence() > held.fence());
    b.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_keeps_one_watch_stream_and_closes_it_when_idle() {
    const NAMES: usize = 10;
    let store = private_etcd().await;
    let url = store.endpoint();
    let mut raw = Client::connect([url.as_str()], None).await.unwrap();
    let (holder, waiter) = (connect(&url).await, connect(&url).await);
    let mut held = Vec::new();
    let (tx, mut grants) = mpsc::unbounded_channel();
    for i in 0..NAMES {
        let lock = name("bounded");
        let lease = hold(&holder, &lock).await;
        wait_for(waiter.clone(), &lock, i, &tx); // one client, many waits
        queue_reaches(&mut raw, &lease, 2).await;
        held.push(lease);
    }
    // The waiting client follows its names on one stream, whatever their
    // number, and its session's notices and the fence floor on the same;
    // the holder follows only those two, however many locks it holds.
    let expected = (2.0, NAMES as f64 + 4.0);
    let open = eventually(
        Duration::from_secs(10),
        "one stream per client and one watch per name",
        || async {
            let m = metrics(&store).await;
            let open = (
                gauge(&m, "etcd_debugging_mvcc_watch_stream_total"),
                gauge(&m, "etcd_debugging_mvcc_watcher_total"),
            );
            assert!(open.0 <= expected.0, "more streams than clients: {open:?}");
            (open == expected).then_some(open)
        },
    )
    .await;
    assert_eq!(open, expected);
    assert_eq!((watched(&waiter), watched(&holder)), (NAMES + 2, 2));

    for lease in &held {
        holder.release(lease).await.unwrap();
    }
    for _ in 0..NAMES {
        let (_, waiter, lease) = tokio::time::timeout(Duration::from_secs(10), grants.recv())
            .await
            .expect("every wait is granted")
            .unwrap();
        waiter.release(&lease).await.unwrap();
    }
    // Unused watches linger a few seconds (a busy name keeps its watch),
    // unused sessions too, then they go, and with the last one the stream.
    until(
        Duration::from_secs(20),
        "every watch and stream closed",
        || async {
            let m = metrics(&store).await;
            let open = (
                gauge(&m, "etcd_debugging_mvcc_watch_stream_total"),
                gauge(&m, "etcd_debugging_mvcc_watcher_total"),
            );
            open == (0.0, 0.0) && watched(&waiter) == 0 && watched(&holder) == 0
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_watch_stream_is_cut_rejoins_the_line() {
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let mut raw = Client::connect([store.endpoint()], None).await.unwrap();
    let holder = connect(&store.endpoint()).await;
    let waiter = connect(&store.endpoint_via(proxy.addr())).await;
    let lock = name("cut");
    let held = hold(&holder, &lock).await;
    let (tx, mut grants) = mpsc::unbounded_channel();
    let _waiting = wait_for(waiter.clone(), &lock, 0, &tx);
    queue_reaches(&mut raw, &held, 2).await;
    // Its session's notices, the fence floor and the queue.
    until(Duration::from_secs(10), "the waiter watching", || async {
        watched(&waiter) > 2
    })
    .await;

    // Every connection of the waiter is reset: its stream dies, and so may
    // any request in flight. The release happens while it reconnects.
    proxy.reset_existing();
    holder.release(&held).await.unwrap();
    let (_, waiter, lease) = tokio::time::timeout(Duration::from_secs(10), grants.recv())
        .await
        .expect("the waiter rejoins and is granted, long before its 60 s re-check")
        .unwrap();
    assert!(lease.fence() > held.fence());
    let view = holder.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(view.fence, lease.fence());
    assert_eq!(
        waiter.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// `watch` wakes on the holder's release, not before. On a free name it
/// does not fire at once (the caller's next attempt takes a free name; a
/// multi-lock waiting for another of its names would loop): it wakes when
/// whoever takes the name after it was armed lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_watch_wakes_on_release_also_of_a_name_free_when_armed() {
    let url = etcd::shared().endpoint();
    let (holder, watcher) = (connect(&url).await, connect(&url).await);
    let lock = name("watch");
    for free_when_armed in [true, false] {
        let mut held = None;
        if !free_when_armed {
            held = Some(hold(&holder, &lock).await);
        }
        let wakeup = watcher
            .watch(&lock, Kind::Lock)
            .await
            .unwrap()
            .expect("etcd notifies");
        let woken = tokio::spawn(wakeup);
        let held = match held {
            Some(held) => held,
            None => hold(&holder, &lock).await,
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !woken.is_finished(),
            "woke while the lock is held (free when armed: {free_when_armed})"
        );
        holder.release(&held).await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), woken)
            .await
            .expect("the release wakes the watcher")
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_dies_in_line_never_takes_the_lock_with_it() {
    // etcd #11456: a waiter whose lease expired was granted the lock. Here
    // the waiter's lease is revoked while it waits: its entry is gone, and it
    // must queue again, not claim the lock on the dead entry's revision.
    let url = etcd::shared().endpoint();
    let (holder, waiter) = (connect(&url).await, connect(&url).await);
    let mut client = raw(&url).await;
    let lock = name("dead-waiter");
    let held = acquire(&holder, &lock, Duration::from_secs(10)).await;
    let waiting = {
        let (waiter, lock) = (waiter.clone(), lock.clone());
        tokio::spawn(async move {
            let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(20));
            waiter
                .acquire_for(&lock, Duration::from_secs(10), &wait)
                .await
        })
    };
    // Find the waiter's entry: the newer of the two queue entries.
    let queue_prefix = queue_of(&held);
    let entries = |client: &Client| {
        let (mut client, prefix) = (client.clone(), queue_prefix.clone());
        async move {
            client
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .unwrap()
                .kvs()
                .to_vec()
        }
    };
    let entry = eventually(
        Duration::from_secs(10),
        "the waiter's queue entry",
        || async {
            entries(&client)
                .await
                .into_iter()
                .find(|kv| kv.create_revision() as u64 != held.fence().get())
        },
    )
    .await;
    client.lease_revoke(entry.lease()).await.unwrap();
    // The waiter sees its entry gone and queues again, with a new entry.
    eventually(
        Duration::from_secs(10),
        "the waiter queueing again",
        || async {
            entries(&client)
                .await
                .iter()
                .any(|kv| kv.create_revision() > entry.create_revision())
                .then_some(())
        },
    )
    .await;
    assert!(!waiting.is_finished(), "the waiter must still be waiting");
    holder.release(&held).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter gets the lock after queueing again")
        .unwrap()
        .unwrap()
        .expect("granted before its deadline");
    assert!(
        lease.fence().get() > entry.create_revision() as u64,
        "granted on a new entry (fence {}), not the revoked one (revision {})",
        lease.fence(),
        entry.create_revision()
    );
    let holder_view = holder.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(holder_view.fence, lease.fence());
    waiter.release(&lease).await.unwrap();
}
