//! Scale, against a private etcd: 10,000 locks held through one `Locker`
//! cost one keep-alive and one check per renew tick, not one per lock;
//! 2,000 waiters on one name in one process follow one view of the queue
//! over one connection and are all served, in order. Each prints what it
//! measured (`--nocapture` shows it).
//!
//! A test binary of its own, apart from `tests/store/`: its 10,000 locks
//! and 2,000 waiters would load the machine under the timing cases there,
//! and the client CPU and RSS it prints are this process's.

#[path = "store/support.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lock_etcd::testing::sessions;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{FencingToken, LockBackend, LockGuard, LockName, Locker};
use tokio::time::Instant;

use crate::support::*;

/// The two tests measure time and CPU: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The requests a renew tick may cost: one keep-alive and one check of the
/// session's keys (a batch arriving before the renewals converge may add
/// one of each).
const REQUESTS_PER_TICK: f64 = 4.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_locks_cost_one_keep_alive_and_one_check_per_tick() {
    const LOCKS: usize = 10_000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = private_etcd().await;
    let ttl = scaled(Duration::from_secs(3)).max(Duration::from_secs(3));
    let ttl = Duration::from_secs(ttl.as_secs_f64().ceil() as u64);
    // Patient requests: 10,000 acquires share two cores with etcd.
    let backend = EtcdBackend::connect_with(
        EtcdConfig::new([store.endpoint()]).request_timeout(scaled(Duration::from_secs(15))),
    )
    .await
    .unwrap();
    let locker = Locker::new(backend.clone()).ttl(ttl);
    let base = name("held");
    let started = Instant::now();
    let guards: Vec<LockGuard> = futures_util::stream::iter(0..LOCKS)
        .map(|i| {
            let locker = locker.clone();
            let name = LockName::new(format!("{base}/{i}")).unwrap();
            async move { locker.try_acquire(&name).await.unwrap().expect("free") }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let took = started.elapsed();
    assert_eq!(sessions(&backend), 1, "every lock on one session");
    // Let the renewals converge on one batch per interval.
    let interval = ttl / 3;
    tokio::time::sleep(interval * 2).await;
    let (before, cpu_before, etcd_before, since) = (
        metrics(&store).await,
        own_cpu(),
        store_cpu(&store),
        Instant::now(),
    );
    let ticks = 5;
    tokio::time::sleep(interval * ticks).await;
    let after = metrics(&store).await;
    let (cpu, etcd_cpu, elapsed) = (
        own_cpu() - cpu_before,
        store_cpu(&store) - etcd_before,
        since.elapsed(),
    );
    let ticks = elapsed.as_secs_f64() / interval.as_secs_f64();
    let per_tick = |d: f64| d / ticks;
    let keep_alives =
        per_tick(received(&after, "LeaseKeepAlive") - received(&before, "LeaseKeepAlive"));
    let checks = per_tick(handled(&after, "LeaseTimeToLive") - handled(&before, "LeaseTimeToLive"));
    let txns = per_tick(handled(&after, "Txn") - handled(&before, "Txn"));
    let ranges = per_tick(handled(&after, "Range") - handled(&before, "Range"));
    eprintln!(
        "{LOCKS} held locks (acquired in {took:?}), per renew tick ({interval:?}): \
         {keep_alives:.1} keep-alives, {checks:.1} key checks, {txns:.1} Txns, {ranges:.1} Ranges; \
         client CPU {:?} per tick ({:.1}% of a core), etcd CPU {:?} per tick",
        cpu.div_f64(ticks),
        100.0 * cpu.as_secs_f64() / elapsed.as_secs_f64(),
        etcd_cpu.div_f64(ticks),
    );
    assert!(
        keep_alives + checks + txns + ranges <= REQUESTS_PER_TICK,
        "{keep_alives} keep-alives, {checks} checks, {txns} Txns, {ranges} Ranges per tick"
    );
    assert!(
        keep_alives >= 0.5,
        "the session was not kept alive: {keep_alives}"
    );
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of {LOCKS} locks were lost");
    futures_util::stream::iter(guards)
        .for_each_concurrent(64, |guard| async move {
            guard.release().await.unwrap();
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_in_one_process_share_one_view_and_are_all_served() {
    const WAITERS: usize = 2_000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = private_etcd().await;
    let backend = EtcdBackend::connect_with(EtcdConfig::new([store.endpoint()]))
        .await
        .unwrap();
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(scaled(Duration::from_secs(120)));
    let lock = name("two-thousand");
    let holder = locker.acquire(&lock).await.unwrap();
    let rss_before = rss_mib("VmRSS:");
    let before = metrics(&store).await;
    let grants: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
    let started = Instant::now();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, lock, grants) = (locker.clone(), lock.clone(), grants.clone());
            tokio::spawn(async move {
                let guard = locker.acquire(&lock).await.expect("served before max_wait");
                grants.lock().unwrap().push(guard.fencing_token());
                guard.release().await.unwrap();
            })
        })
        .collect();
    // Everyone in line, then the holder lets go.
    let queue = queue_of(&holder.lease());
    let raw = raw(&store.endpoint()).await;
    lock_conformance::kit::poll::until(
        scaled(Duration::from_secs(60)),
        "2,000 waiters in line",
        || {
            let (mut raw, queue) = (raw.clone(), queue.clone());
            async move { queue_len(&mut raw, queue).await == WAITERS + 1 }
        },
    )
    .await;
    let queued_in = started.elapsed();
    // This test's own plain client holds one more.
    let connections = connections_to(store.addr().port()) - 1;
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let served_in = started.elapsed();
    let after = metrics(&store).await;
    let spent = |method| handled(&after, method) - handled(&before, method);
    let grants = grants.lock().unwrap().clone();
    eprintln!(
        "{WAITERS} waiters: in line after {queued_in:?}, all served after {served_in:?}; \
         {connections} connection(s) to etcd; RSS {rss_before:.0} MiB before, peak {:.0} MiB; \
         etcd handled {} Txns and {} Ranges",
        rss_mib("VmHWM:"),
        spent("Txn"),
        spent("Range"),
    );
    assert_eq!(grants.len(), WAITERS, "every waiter served");
    assert!(
        grants.windows(2).all(|w| w[0] < w[1]),
        "FIFO: each grant's fence (its place in line) above the one before"
    );
    assert!(
        connections <= 1,
        "{connections} connections: one per client, not per waiter"
    );
    // An enqueue and a release each per waiter. The rest are reads of the
    // line (a Txn of gets), one per wave of enqueues and per re-check
    // interval: how many waves depends on how the waiters' arrivals
    // interleave, so the bound is the ratio, never one read per waiter
    // (3 x WAITERS), with the same one-in-ten allowance as the Ranges.
    assert!(
        spent("Txn") <= (2 * WAITERS + WAITERS / 10) as f64,
        "{} Txns for {WAITERS} waiters",
        spent("Txn")
    );
    assert!(
        spent("Range") <= (WAITERS / 10) as f64,
        "{} Ranges for {WAITERS} waiters: the line is read per waiter",
        spent("Range")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_cost_etcd_two_txns() {
    const CYCLES: u32 = 3_000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = private_etcd().await;
    let backend = connect(&store.endpoint()).await;
    let lock = name("uncontended");
    let ttl = Duration::from_secs(10);
    for _ in 0..200 {
        let lease = acquire(&backend, &lock, ttl).await;
        backend.release(&lease).await.unwrap();
    }
    let (before, etcd_before, own_before, started) = (
        metrics(&store).await,
        store_cpu(&store),
        own_cpu(),
        Instant::now(),
    );
    for _ in 0..CYCLES {
        let lease = acquire(&backend, &lock, ttl).await;
        backend.release(&lease).await.unwrap();
    }
    let took = started.elapsed();
    let (after, etcd_cpu, own) = (
        metrics(&store).await,
        store_cpu(&store) - etcd_before,
        own_cpu() - own_before,
    );
    let spent = |method| handled(&after, method) - handled(&before, method);
    let keep_alives = received(&after, "LeaseKeepAlive") - received(&before, "LeaseKeepAlive");
    eprintln!(
        "uncontended: {CYCLES} acquire+release in {took:?} ({:.0}/s); etcd CPU {:?} per cycle, \
         client CPU {:?} per cycle; {} Txns, {} Ranges, {keep_alives} keep-alives",
        f64::from(CYCLES) / took.as_secs_f64(),
        etcd_cpu / CYCLES,
        own / CYCLES,
        spent("Txn"),
        spent("Range"),
    );
    assert_eq!(
        spent("Txn"),
        f64::from(2 * CYCLES),
        "one Txn to acquire, one to release"
    );
    assert_eq!(spent("Range"), 0.0, "no read");
    // The session is refreshed once a quarter of its TTL: a few keep-alives.
    let quarters = took.as_secs_f64() / (ttl / 4).as_secs_f64();
    assert!(
        keep_alives <= quarters.ceil() + 1.0,
        "{keep_alives} keep-alives in {took:?}"
    );
}
