//! The hand-off path, against real etcd servers from the harness: a
//! hand-off costs etcd the holder's delete and nothing else, a cancelled
//! waiter passes its turn on, each client keeps one watch stream that closes
//! when unused, and a waiter whose stream is cut rejoins.
//!
//! Waiters here re-check only every 60 s, so only etcd's notifications can
//! move them on time.

use std::collections::HashMap;
use std::time::Duration;

use lock_conformance::proxy::FaultProxy;
use lock_conformance::stores::{self, etcd};
use lock_etcd::etcd_client::{Client, GetOptions};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::{LockBackendExt, WaitPolicy};
use lockcore::{Attempt, Lease, LockBackend, LockName, OwnerToken, ReleaseOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

fn name(prefix: &str) -> LockName {
    let salt = OwnerToken::new().as_uuid().as_u128() as u32;
    LockName::new(format!("handoff-test/{prefix}/{salt:08x}")).unwrap()
}

async fn connect(url: &str) -> EtcdBackend {
    EtcdBackend::connect_with(EtcdConfig::new([url]))
        .await
        .expect("connect to the harness etcd")
}

async fn private_etcd() -> stores::Store {
    tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default()))
        .await
        .unwrap()
        .expect("a private etcd")
}

async fn hold(backend: &EtcdBackend, name: &LockName) -> Lease {
    match backend
        .try_acquire_for(name, TTL)
        .await
        .expect("try_acquire")
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should be free"),
    }
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

/// Waits until the queue of the lock whose grant is `lease` has `len` entries.
async fn queue_reaches(client: &mut Client, backend: &EtcdBackend, lease: &Lease, len: usize) {
    let key = backend.key_of(lease).unwrap();
    let queue = key[..key.len() - 16].to_vec();
    let options = GetOptions::new().with_prefix().with_count_only();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let count = client
            .get(queue.clone(), Some(options.clone()))
            .await
            .unwrap()
            .count();
        if count as usize == len {
            return;
        }
        assert!(
            Instant::now() < until,
            "the queue has {count} entries, not {len}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// etcd's Prometheus metrics (served on the client port), unlabelled sums.
async fn metrics(store: &stores::Store) -> HashMap<String, f64> {
    let mut conn = tokio::net::TcpStream::connect(store.addr()).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap();
    let mut values = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        *values.entry(series.to_owned()).or_default() += value;
    }
    values
}

fn txns(metrics: &HashMap<String, f64>) -> f64 {
    metrics
        .iter()
        .filter(|(series, _)| {
            series.starts_with("grpc_server_handled_total{")
                && series.contains("grpc_method=\"Txn\"")
        })
        .map(|(_, v)| v)
        .sum()
}

fn gauge(metrics: &HashMap<String, f64>, name: &str) -> f64 {
    metrics.get(name).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_costs_etcd_the_release_and_nothing_else() {
    // Every etcd Txn of the run is counted on a private server: each waiter
    // pays its enqueue, one read when it starts following the queue, and its
    // release. Moving up the line and taking the lock cost nothing: no read,
    // no write, no new watch.
    const WAITERS: usize = 6;
    let store = private_etcd().await;
    let url = store.url();
    let mut raw = Client::connect([url.as_str()], None).await.unwrap();
    let holder = connect(&url).await;
    let lock = name("one-write");
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        waiters.push(connect(&url).await);
    }
    let before = txns(&metrics(&store).await);

    let first = hold(&holder, &lock).await;
    let (tx, mut grants) = mpsc::unbounded_channel();
    for (i, waiter) in waiters.into_iter().enumerate() {
        wait_for(waiter, &lock, i, &tx);
        queue_reaches(&mut raw, &holder, &first, i + 2).await; // arrival order
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

    let spent = txns(&metrics(&store).await) - before;
    let expected = 2 + 3 * WAITERS; // the holder's acquire and release, 3 per waiter
    assert_eq!(
        spent, expected as f64,
        "etcd handled {spent} Txns for {WAITERS} hand-offs, expected {expected}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_passes_its_turn_on() {
    let url = etcd::shared().url();
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
    queue_reaches(&mut raw, &holder, &held, 2).await;
    let _waiting_b = wait_for(b, &lock, 1, &tx);
    queue_reaches(&mut raw, &holder, &held, 3).await;

    // A gives up (its acquire future is dropped): its entry goes.
    waiting_a.abort();
    queue_reaches(&mut raw, &holder, &held, 2).await;
    // B is next, but the holder still holds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(grants.try_recv().is_err(), "B was granted a held lock");
    let view = holder.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(view.fence, held.fence());

    let released = Instant::now();
    holder.release(&held).await.unwrap();
    let (i, b, lease) = tokio::time::timeout(Duration::from_secs(5), grants.recv())
        .await
        .expect("B is granted on the release, not at its 60 s re-check")
        .unwrap();
    assert_eq!(i, 1);
    assert!(released.elapsed() < Duration::from_secs(2));
    assert!(lease.fence() > held.fence());
    b.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_keeps_one_watch_stream_and_closes_it_when_idle() {
    const NAMES: usize = 10;
    let store = private_etcd().await;
    let url = store.url();
    let mut raw = Client::connect([url.as_str()], None).await.unwrap();
    let (holder, waiter) = (connect(&url).await, connect(&url).await);
    let mut held = Vec::new();
    let (tx, mut grants) = mpsc::unbounded_channel();
    for i in 0..NAMES {
        let lock = name("bounded");
        let lease = hold(&holder, &lock).await;
        wait_for(waiter.clone(), &lock, i, &tx); // one client, many waits
        queue_reaches(&mut raw, &holder, &lease, 2).await;
        held.push(lease);
    }
    // The waiting client follows its names on one stream, whatever their
    // number; the holder's loss signals (its locks are held past a tenth
    // of their TTL by now) share another.
    let expected = (2.0, 2.0 * NAMES as f64);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics(&store).await;
        let open = (
            gauge(&m, "etcd_debugging_mvcc_watch_stream_total"),
            gauge(&m, "etcd_debugging_mvcc_watcher_total"),
        );
        if open == expected {
            break;
        }
        assert!(open.0 <= expected.0, "more streams than clients: {open:?}");
        assert!(
            Instant::now() < until,
            "(streams, watches) {open:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        (waiter.watched_names(), holder.watched_names()),
        (NAMES, NAMES)
    );

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
    // then go, and with the last one the stream.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(&store).await;
        let open = (
            gauge(&m, "etcd_debugging_mvcc_watch_stream_total"),
            gauge(&m, "etcd_debugging_mvcc_watcher_total"),
        );
        if open == (0.0, 0.0) && waiter.watched_names() == 0 && holder.watched_names() == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "still open (streams, watches): {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_watch_stream_is_cut_rejoins_the_line() {
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let mut raw = Client::connect([store.url()], None).await.unwrap();
    let holder = connect(&store.url()).await;
    let waiter = connect(&store.url_via(proxy.addr())).await;
    let lock = name("cut");
    let held = hold(&holder, &lock).await;
    let (tx, mut grants) = mpsc::unbounded_channel();
    let _waiting = wait_for(waiter.clone(), &lock, 0, &tx);
    queue_reaches(&mut raw, &holder, &held, 2).await;
    let until = Instant::now() + Duration::from_secs(10);
    while waiter.watched_names() == 0 {
        assert!(Instant::now() < until, "the waiter never watched");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_watch_wakes_on_release_and_at_once_when_free() {
    let url = etcd::shared().url();
    let (holder, watcher) = (connect(&url).await, connect(&url).await);
    let lock = name("watch");
    let free = watcher.watch(&lock).await.unwrap().expect("etcd notifies");
    tokio::time::timeout(Duration::from_secs(1), free)
        .await
        .expect("a free name wakes at once");

    let held = hold(&holder, &lock).await;
    let wakeup = watcher.watch(&lock).await.unwrap().expect("etcd notifies");
    let woken = tokio::spawn(wakeup);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!woken.is_finished(), "woke while the lock is held");
    holder.release(&held).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), woken)
        .await
        .expect("the release wakes the watcher")
        .unwrap();
}
