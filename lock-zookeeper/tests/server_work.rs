//! What an uncontended acquire and release costs the server: requests, and
//! the server process's CPU time (a private server, so nobody else's work
//! counts), for `try_acquire` and for a waiting `acquire`. Prints what it
//! measured.

mod support;

use std::time::Duration;

use lock_conformance::kit::stores::zookeeper;
use lock_conformance::kit::usage::cpu_time;
use lockcore::LockBackend;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use support::{answered, connect, session_id, unique};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_a_create_and_a_delete() {
    requests_per_cycle("an_uncontended_cycle_is_a_create_and_a_delete", false).await;
}

/// A waiting `acquire` that finds the lock free costs the same: its create
/// alone shows it first (the sequence proof), with no listing of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_waiting_acquire_is_a_create_and_a_delete() {
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
    if !support::may_launch_servers(test) {
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
    let (cpu, requests) = (cpu_time(pid), answered(store.addr(), sid));
    for _ in 0..CYCLES {
        cycle().await;
    }
    let cpu = cpu_time(pid).saturating_sub(cpu);
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
