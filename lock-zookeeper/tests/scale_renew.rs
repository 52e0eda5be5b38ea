//! Many held locks, renewed by one `Locker`: sessions are the leases, so a
//! renewal tick costs one `sync` for the whole batch, each lease proven by
//! the watch its node already has. Prints what it measured.

mod support;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::stores::zookeeper;
use lockcore::{LockGuard, Locker};
use support::{answered, connect, cpu_time, session_id, unique};
use tokio::time::Instant;

const LOCKS: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_locks_cost_one_request_per_renewal_tick() {
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
