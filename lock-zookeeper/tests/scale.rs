//! Scale and cost, each test printing what it measured: many waiters on one
//! name in one process (one session, memory linear in the waiters, every
//! one served in arrival order, requests per waiter bounded by a constant);
//! many held locks renewed by one `Locker` (one `sync` per renewal tick for
//! the whole batch); and what an uncontended acquire and release costs the
//! server (requests, and a private server's CPU time).
//!
//! A test binary of its own, not a module of `tests/store`: what it measures
//! belongs to the process (its peak RSS, its CPU time, how fast its runtime
//! serves 2,000 waiters), which the other tests of a shared binary would
//! add to while they run; and its 10,000 locks and 2,000 waiters would load
//! the timing-sensitive tests running beside them.

#[path = "store/support.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::stores::zookeeper;
use lock_conformance::kit::usage;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{FencingToken, LockBackend, LockError, LockGuard, Locker};
use tokio::time::Instant;

use crate::support::{
    answered, children, connect, connections, cpu_time, peak_rss, raw, session_id, unique,
};

/// One measurement at a time: each stands for what the process and the
/// server do for it alone, and 10,000 locks beside 2,000 waiters on one
/// server overload it (requests unanswered for seconds, at load 22).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const WAITERS: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_on_one_name_are_served_in_order() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = zookeeper::shared();
    let backend = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let sid = session_id(&backend);
    let locker = Locker::new(backend.clone()).ttl(backend.session_timeout());
    let name = unique("waiters");
    let parent = backend.lock_path(&name);
    let holder = locker.acquire(&name).await.unwrap();

    let (rss_before, requests_before) = (peak_rss(), answered(store.addr(), sid));
    let served: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
    let wait = Duration::from_secs(120);
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, name, served) = (locker.clone(), name.clone(), served.clone());
            tokio::spawn(async move {
                let guard = locker.acquire_timeout(&name, wait).await?;
                served.lock().unwrap().push(guard.fencing_token());
                guard.release().await?;
                Ok::<_, LockError>(())
            })
        })
        .collect();
    let queueing = Instant::now();
    until(Duration::from_secs(60), "every waiter in line", || async {
        children(&observer, &parent).await.len() == WAITERS + 1
    })
    .await;
    let queued = queueing.elapsed();
    let released = Instant::now();
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    let all_served = released.elapsed();
    let requests = answered(store.addr(), sid) - requests_before;
    let grown = peak_rss().saturating_sub(rss_before);
    let links = connections(store.addr(), sid).len();
    eprintln!(
        "{WAITERS} waiters: queued in {queued:?}, all served {all_served:?} after the first \
         release; {links} connection(s); {requests} requests ({:.1} per waiter); peak RSS +{} MiB",
        requests as f64 / WAITERS as f64,
        grown >> 20
    );

    let served = served.lock().unwrap().clone();
    assert_eq!(served.len(), WAITERS, "every waiter is served");
    // A fence is the czxid of the waiter's node: its place in line. FIFO
    // means grants in fence order.
    let out_of_order = served.windows(2).filter(|w| w[1] <= w[0]).count();
    assert_eq!(out_of_order, 0, "grants out of arrival order");
    assert_eq!(
        links, 1,
        "one session, one connection, whatever the waiters"
    );
    assert!(
        requests <= 8 * WAITERS as u64,
        "{requests} requests for {WAITERS} waiters: re-checks are not bounded"
    );
    assert!(
        grown <= 200 << 20,
        "peak RSS grew by {} MiB for {WAITERS} waiters",
        grown >> 20
    );
    assert!(
        all_served <= Duration::from_secs(30).mul_f64(crate::support::time_scale()),
        "serving {WAITERS} waiters took {all_served:?}"
    );
}

const LOCKS: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_locks_cost_one_request_per_renewal_tick() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = zookeeper::shared();
    let backend = connect(store.endpoint()).await.unwrap();
    let sid = session_id(&backend);
    let ttl = backend.session_timeout();
    let every = ttl / 3;
    let locker = Locker::new(backend.clone()).ttl(ttl).renew_every(every);

    let taking = Instant::now();
    let names: Vec<_> = (0..LOCKS).map(|i| unique(&format!("held-{i}"))).collect();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(LOCKS);
    for chunk in names.chunks(250) {
        let taken =
            futures_util::future::join_all(chunk.iter().map(|name| locker.try_acquire(name))).await;
        for guard in taken {
            guards.push(guard.unwrap().expect("a fresh name is free"));
        }
    }
    let taken_in = taking.elapsed();
    // Each grant's node is watched a sixteenth of the session after it was
    // made; from then on its renewals need no read of its own, and the
    // renewer's batches converge on one per interval. Wait for a quiet
    // interval, then measure three.
    let addr = store.addr();
    eventually(
        ttl * 4,
        "renewals settled to one request per interval",
        || async {
            let before = answered(addr, sid);
            tokio::time::sleep(every).await;
            (answered(addr, sid) - before <= 2).then_some(())
        },
    )
    .await;

    let (requests_before, cpu_before, started) =
        (answered(store.addr(), sid), cpu_time(), Instant::now());
    const TICKS: u32 = 3;
    tokio::time::sleep(every * TICKS).await;
    let (requests, cpu, window) = (
        answered(store.addr(), sid) - requests_before,
        cpu_time().saturating_sub(cpu_before),
        started.elapsed(),
    );
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    eprintln!(
        "{LOCKS} held locks: taken in {taken_in:?}; over {window:?} ({TICKS} renewal intervals of \
         {every:?}): {requests} requests, client CPU {cpu:?} ({:?} per interval)",
        cpu / TICKS
    );
    assert_eq!(lost, 0, "every lock is still held");
    // One sync per tick, plus slack for a tick that split in two.
    assert!(
        requests <= u64::from(TICKS) * 2 + 2,
        "{requests} requests over {TICKS} renewal intervals of {LOCKS} locks"
    );
    while !guards.is_empty() {
        let chunk: Vec<LockGuard> = guards.drain(..guards.len().min(250)).collect();
        for released in
            futures_util::future::join_all(chunk.into_iter().map(LockGuard::release)).await
        {
            released.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_a_create_and_a_delete() {
    let _alone = ONE_AT_A_TIME.lock().await;
    requests_per_cycle("an_uncontended_cycle_is_a_create_and_a_delete", false).await;
}

/// A waiting `acquire` that finds the lock free costs the same: its create
/// alone shows it first (the sequence proof), with no listing of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_waiting_acquire_is_a_create_and_a_delete() {
    let _alone = ONE_AT_A_TIME.lock().await;
    requests_per_cycle(
        "an_uncontended_waiting_acquire_is_a_create_and_a_delete",
        true,
    )
    .await;
}

/// Measures uncontended cycles of `try_acquire` (or a waiting `acquire`)
/// and release on a private server, and checks they cost a create and a
/// delete each.
async fn requests_per_cycle(test: &str, waiting: bool) {
    if !crate::support::may_launch_servers(test) {
        return;
    }
    let store = tokio::task::spawn_blocking(|| zookeeper::start(zookeeper::Options::default()))
        .await
        .unwrap()
        .unwrap();
    let pid = store.pid().expect("a launched server");
    let backend = connect(store.endpoint()).await.unwrap();
    let sid = session_id(&backend);
    let name = unique("cycles");
    let ttl = backend.session_timeout();
    let cycle = async || {
        let lease = if waiting {
            let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(60));
            backend.acquire_for(&name, ttl, &wait).await.unwrap()
        } else {
            backend
                .try_acquire_for(&name, ttl)
                .await
                .unwrap()
                .into_lease()
        };
        backend.release(&lease.unwrap()).await.unwrap();
    };
    // Warm up the server's JIT and the session's proof of an empty queue.
    for _ in 0..500 {
        cycle().await;
    }
    const CYCLES: u64 = 3_000;
    let (cpu, requests) = (usage::cpu_time(pid), answered(store.addr(), sid));
    for _ in 0..CYCLES {
        cycle().await;
    }
    let cpu = usage::cpu_time(pid).saturating_sub(cpu);
    let requests = answered(store.addr(), sid) - requests;
    eprintln!(
        "uncontended {} + release: {:.2} requests, {:?} server CPU per cycle ({CYCLES} cycles)",
        if waiting { "acquire" } else { "try_acquire" },
        requests as f64 / CYCLES as f64,
        cpu / CYCLES as u32
    );
    // A create and a delete; a cycle slower than a twentieth of the
    // session (a loaded machine) may add its node's watch.
    assert!(
        (2 * CYCLES..2 * CYCLES + CYCLES / 4).contains(&requests),
        "{requests} requests for {CYCLES} cycles"
    );
}
