//! Scale, against a private `redis-server`: 10,000 held locks renewed by one
//! `Locker` cost a few scripts per renew tick, not one per lock; 2,000
//! waiters on one name in one process share two connections and are all
//! served. Each prints what it measured (`--nocapture` shows it).
//!
//! A binary of its own: the waiters' memory is read from this process's
//! resident set (`VmRSS`), which any test running beside it would inflate;
//! and the two cases take turns ([`ALONE`]) for the same reason, and so
//! that each has the machine's time to itself.

#[path = "store/support.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lock_conformance::kit::stores::redis::{Options, Persistence};
use lock_redis::RedisBackend;
use lock_redis::redis;
use lockcore::{LockGuard, LockName, Locker};
use support::{clients_of_type, command_calls, connect_scaled, private, raw, scaled, unique};
use tokio::time::Instant;

/// User + system CPU time of this process so far.
fn cpu_time() -> Duration {
    lock_conformance::kit::usage::own_cpu_time()
}

/// This process's resident set now (`VmRSS`) or at its peak (`VmHWM`), in MiB.
fn rss_mib(which: &str) -> f64 {
    lock_conformance::kit::usage::own_memory_mib(which)
}

/// Held for the whole of each case: they measure this process (its
/// memory, its CPU time) and load the machine, so they never overlap.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Scripts the server ran (EVALSHA, plus EVAL after a NOSCRIPT).
async fn scripts_run(con: &redis::aio::MultiplexedConnection) -> u64 {
    command_calls(con, "evalsha").await + command_calls(con, "eval").await
}

/// 10,000 locks held through one `Locker` with a 3 s TTL (renewed every
/// second): over five renew intervals the server runs about one script per
/// 1,000 leases per tick, not one per lease, and every lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_locks_cost_one_script_per_thousand_per_tick() {
    let _alone = ALONE.lock().await;
    const LOCKS: usize = 10_000;
    let store = private(Options::default().persistence(Persistence::None)).await;
    let con = raw(&store.url()).await;
    let ttl = scaled(Duration::from_secs(3));
    let locker = Locker::new(connect_scaled(&store.url()).await).ttl(ttl);
    let base = unique("held");
    let guards: Vec<LockGuard> = futures::stream::iter(0..LOCKS)
        .map(|i| {
            let locker = locker.clone();
            let name = LockName::new(format!("{base}/{i}")).unwrap();
            async move { locker.try_acquire(&name).await.unwrap().expect("free") }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    // Let the renewals converge on one batch per interval.
    let interval = ttl / 3;
    tokio::time::sleep(interval * 2).await;
    let (scripts_before, cpu_before, started) =
        (scripts_run(&con).await, cpu_time(), Instant::now());
    let intervals = 5;
    tokio::time::sleep(interval * intervals).await;
    let scripts = scripts_run(&con).await - scripts_before;
    let (cpu, took) = (cpu_time() - cpu_before, started.elapsed());
    let ticks = took.as_secs_f64() / interval.as_secs_f64();
    let per_tick = scripts as f64 / ticks;
    println!(
        "SCALE renew: {LOCKS} locks, {scripts} scripts in {took:.1?} ({ticks:.1} renew intervals): \
         {per_tick:.1} scripts per tick; client CPU {cpu:?} ({:.1}% of one core)",
        100.0 * cpu.as_secs_f64() / took.as_secs_f64()
    );
    let chunks = LOCKS.div_ceil(1000) as f64;
    // At most one batch per interval plus one straggler batch per interval
    // (leases renewed early join the next), each `chunks` scripts.
    assert!(
        per_tick <= 2.0 * chunks + 2.0,
        "{per_tick:.1} scripts per renew tick for {LOCKS} locks: renewals are not batched"
    );
    assert!(
        guards.iter().all(LockGuard::is_held),
        "every lock stays held"
    );
    let before_release = scripts_run(&con).await;
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert!(scripts_run(&con).await - before_release >= LOCKS as u64);
}

/// 2,000 tasks of one process wait for one name through one `Locker`
/// (default 1 s re-check), each taking and releasing it in turn: two
/// connections to the server (commands and pub/sub), every one served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_share_two_connections_and_are_all_served() {
    let _alone = ALONE.lock().await;
    const WAITERS: usize = 2_000;
    let store = private(Options::default().persistence(Persistence::None)).await;
    let con = raw(&store.url()).await;
    let clients_before =
        clients_of_type(&con, "normal").await + clients_of_type(&con, "pubsub").await;
    let locker = Locker::new(connect_scaled(&store.url()).await)
        .ttl(Duration::from_secs(30))
        .max_wait(scaled(Duration::from_secs(60)));
    let name = unique("crowd");
    let holder = locker.acquire(&name).await.unwrap();
    let rss_before = rss_mib("VmRSS:");
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, name, served) = (locker.clone(), name.clone(), served.clone());
            tokio::spawn(async move {
                let guard = locker.acquire(&name).await.unwrap();
                let fence = guard.fencing_token();
                served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                guard.release().await.unwrap();
                fence
            })
        })
        .collect();
    support::in_line(&con, &name, WAITERS).await;
    let rss_in_line = rss_mib("VmRSS:");
    let clients = clients_of_type(&con, "normal").await + clients_of_type(&con, "pubsub").await
        - clients_before;
    let scripts_before = scripts_run(&con).await;
    let started = Instant::now();
    holder.release().await.unwrap();
    let mut fences = Vec::with_capacity(WAITERS);
    for task in tasks {
        fences.push(task.await.unwrap());
    }
    let took = started.elapsed();
    let scripts = scripts_run(&con).await - scripts_before;
    println!(
        "SCALE waiters: {WAITERS} served in {took:.2?} over {clients} connections; \
         {scripts} scripts ({:.1} per hand-off); RSS {rss_before:.1} MiB before the waits, \
         {rss_in_line:.1} MiB with all in line ({:.1} KiB per waiter), peak {:.1} MiB",
        scripts as f64 / WAITERS as f64,
        (rss_in_line - rss_before) * 1024.0 / WAITERS as f64,
        rss_mib("VmHWM:")
    );
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), WAITERS);
    // Release + claim per hand-off, plus at most one re-check per waiter per
    // second of waiting (the default re-check).
    let recheck_bound = WAITERS as f64 * (2.0 + took.as_secs_f64().ceil()) + 100.0;
    assert!(
        scripts as f64 <= recheck_bound,
        "{scripts} scripts for {WAITERS} hand-offs in {took:?}: waiters poll"
    );
    let per_waiter_kib = (rss_in_line - rss_before) * 1024.0 / WAITERS as f64;
    assert!(per_waiter_kib < 64.0, "{per_waiter_kib:.1} KiB per waiter");
    assert_eq!(
        clients, 2,
        "one command and one pub/sub connection, whatever the waiters"
    );
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), WAITERS, "one grant, one fence each");
    assert_eq!(
        support::queue_len(&con, &name).await,
        0,
        "nothing left in line"
    );
}

/// The server's CPU seconds so far (user + system, INFO cpu).
async fn server_cpu(con: &redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// The AOF's size (0 without one).
async fn aof_bytes(con: &redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("aof_current_size:"))
        .map_or(0, |n| n.trim().parse().unwrap_or(0))
}

/// Microseconds the server spent in scripts so far (INFO commandstats).
async fn script_usec(con: &redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix("usec=")))
        .map_or(0, |n| n.parse().unwrap())
}

/// A measurement, not a check: server CPU per uncontended acquire + release
/// on a durable server (AOF, `appendfsync always`), as time spent in the
/// scripts and as the server process's CPU. Run with `--ignored
/// --nocapture` in release mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn measure_server_cpu_per_uncontended_cycle() {
    const CYCLES: u32 = 20_000;
    let durable = std::env::var("LEAN_DURABLE").is_ok();
    let store = private(if durable {
        Options::durable()
    } else {
        Options::default().persistence(Persistence::None)
    })
    .await;
    let con = raw(&store.url()).await;
    let backend = RedisBackend::connect(&store.url()).await.unwrap();
    let name = unique("lean");
    let cycle = async || {
        let lease = lockcore::backend::LockBackendExt::try_acquire_for(
            &backend,
            &name,
            Duration::from_secs(30),
        )
        .await
        .unwrap()
        .into_lease()
        .unwrap();
        lockcore::LockBackend::release(&backend, &lease)
            .await
            .unwrap();
    };
    for _ in 0..200 {
        cycle().await;
    }
    let aof_before = aof_bytes(&con).await;
    let (usec, cpu, started) = (
        script_usec(&con).await,
        server_cpu(&con).await,
        Instant::now(),
    );
    for _ in 0..CYCLES {
        cycle().await;
    }
    let took = started.elapsed();
    let aof = aof_bytes(&con).await.saturating_sub(aof_before) as f64 / f64::from(CYCLES);
    let script = (script_usec(&con).await - usec) as f64 / f64::from(CYCLES);
    let cpu = (server_cpu(&con).await - cpu) * 1e6 / f64::from(CYCLES);
    println!(
        "LEAN uncontended acquire+release: {script:.1} µs in scripts, {cpu:.1} µs server CPU, \
         {aof:.0} AOF bytes per cycle; {:.0} cycles/s",
        f64::from(CYCLES) / took.as_secs_f64()
    );
}
