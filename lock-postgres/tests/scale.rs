//! Scale and cost. A batch renewal checks each lease on its own in one
//! statement; 10,000 locks held through one `Locker` renew in one statement
//! per tick; 2,000 waiters on one name share the instance's bounded
//! connections and are all served, in order. And what a lock operation
//! costs the server, measured on a private server with
//! `pg_stat_statements`: statements and WAL-flushing commits per
//! uncontended acquire+release (asserted: the lean path is one statement
//! each, and a try on a held lock writes nothing), and the server's CPU per
//! cycle and per contended hand-off (printed, for the README's numbers).
//!
//! A test binary of its own, apart from `tests/store/`: its thousands of
//! locks and waiters would load the machine under the timing cases there,
//! and its CPU and peak memory are this process's.

#[path = "store/support.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_postgres::sqlx::{self, Connection, PgConnection, PgPool};
use lock_postgres::testing;
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, Backoff, Lease, LockBackend, LockError, LockName, Locker, OwnerToken};
use tokio::time::Instant;

use crate::support::{
    acquired, backend, client_cpu, counting_observer, counting_server, lock_name, peak_rss, reset,
    scaled, server_cpu, shared_url, statements, unique, with_params,
};

/// A batch of leases in every state gets, in order, exactly what `renew`
/// would answer each: the live ones renewed (and only those extended on the
/// server), a duplicate answered like its twin, the expired-and-taken, the
/// released and the forged ones `NotHeld`.
#[tokio::test]
async fn renew_many_checks_each_lease_on_its_own() {
    let (a, b) = (backend(&shared_url()).await, backend(&shared_url()).await);
    let ttl = Duration::from_secs(30);
    let live = acquired(&a, &lock_name("live"), ttl).await;
    let other = acquired(&a, &lock_name("other"), ttl).await;
    let released = acquired(&a, &lock_name("released"), ttl).await;
    a.release(&released).await.unwrap();
    let expired = acquired(&a, &lock_name("expired"), Duration::from_millis(50)).await;
    let taken = eventually(Duration::from_secs(10), "the expired lock", || async {
        b.try_acquire_for(expired.name(), ttl)
            .await
            .unwrap()
            .into_lease()
    })
    .await;
    // Someone else's grant, presented with a made-up owner.
    let forged = Lease::new(
        other.name().clone(),
        OwnerToken::new(),
        other.fence(),
        other.ttl(),
        lockcore::backend::Moment::now(),
    );
    let batch = [
        live.clone(),
        expired.clone(),
        other.clone(),
        released,
        forged,
        live.clone(),
    ];
    let before = a.inspect(live.name()).await.unwrap().unwrap().expires_in;
    let results = a.renew_many(&batch).await;
    let held: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(held, [true, false, true, false, false, true], "{results:?}");
    for result in &results {
        if let Err(e) = result {
            assert!(matches!(e, LockError::NotHeld { .. }), "{e:?}");
        }
    }
    for (lease, result) in batch.iter().zip(&results) {
        if let Ok(renewed) = result {
            assert_eq!(
                (renewed.fence(), renewed.owner()),
                (lease.fence(), lease.owner())
            );
        }
    }
    let after = a.inspect(live.name()).await.unwrap().unwrap().expires_in;
    assert!(after >= before, "{before:?} -> {after:?}");
    assert_eq!(
        b.inspect(taken.name()).await.unwrap().map(|h| h.fence),
        Some(taken.fence()),
        "the taken grant is untouched"
    );
    assert!(a.renew_many(&[]).await.is_empty());
}

/// 10,000 locks held through one `Locker` with a short TTL: every renewal
/// tick is one statement (`pg_stat_statements` on a private server), and no
/// lock is lost. Prints statements per tick and the client's CPU per tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_locks_renew_in_one_statement_per_tick() {
    const LOCKS: usize = 10_000;
    let store = counting_server();
    let mut observer = counting_observer(&store).await;
    let url = with_params(&store.url(), "pool_size=8");
    let client = backend(&url).await;
    let every = scaled(Duration::from_secs(1));
    let locker = Locker::new(client.clone())
        .ttl(every * 4)
        .renew_every(every);
    let prefix = unique("held");
    let names: Vec<LockName> = (0..LOCKS)
        .map(|i| LockName::new(format!("{prefix}/{i}")).unwrap())
        .collect();
    let guards = Arc::new(Mutex::new(Vec::with_capacity(LOCKS)));
    let workers: Vec<_> = names
        .chunks(LOCKS / 16)
        .map(|chunk| {
            let (locker, chunk, guards) = (locker.clone(), chunk.to_vec(), guards.clone());
            tokio::spawn(async move {
                for name in chunk {
                    let guard = locker.try_acquire(&name).await.unwrap().expect("free");
                    guards.lock().unwrap().push(guard);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let guards = std::mem::take(&mut *guards.lock().unwrap());
    // Renewals converge on one batch per interval within an interval.
    tokio::time::sleep(every * 2).await;
    reset(&mut observer).await;
    let (cpu, started) = (client_cpu(), Instant::now());
    tokio::time::sleep(every * 5).await;
    let (cpu, elapsed) = (client_cpu().saturating_sub(cpu), started.elapsed());
    // The batch renewal starts `WITH r AS`, a single renewal `UPDATE`.
    let (batches, _, batch_ms) = statements(&mut observer, "WITH r AS%").await;
    let (singles, _, _) = statements(&mut observer, "UPDATE %").await;
    let ticks = elapsed.as_secs_f64() / every.as_secs_f64();
    eprintln!(
        "{LOCKS} held locks: {batches} renewal statements in {ticks:.1} ticks \
         ({:.1} ms of server time each), client CPU {:.1} ms per tick",
        batch_ms / batches.max(1) as f64,
        cpu.as_secs_f64() * 1e3 / ticks
    );
    assert_eq!(singles, 0, "no lock renewed on its own");
    // At most one batch per interval plus one straggler batch per interval
    // (on a busy host leases renewed early join the next tick later), and
    // one more at each end of the window: per-lock renewals would be
    // thousands.
    assert!(
        batches as f64 <= 2.0 * ticks.ceil() + 2.0,
        "{batches} renewal statements in {ticks:.1} ticks"
    );
    assert!(batches >= 1, "the locks were renewed");
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "no lock lost while renewed in batches");
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// 2,000 waiters on one name in one backend instance (one `Locker`):
/// connections stay at the pool, the listener and two turnstiles (one
/// line in the instance, whose first waiter alone queues at the server),
/// every waiter is served and releases in turn, grants follow arrival
/// order, and memory stays small. Prints connections, peak RSS and the
/// time until all are served.
#[tokio::test]
async fn two_thousand_waiters_are_served_over_bounded_connections() {
    const WAITERS: usize = 2000;
    const POOL: u32 = 4;
    let app = unique("waiters");
    let url = with_params(
        &shared_url(),
        &format!("application_name={app}&pool_size={POOL}"),
    );
    let holder = backend(&shared_url()).await;
    let lock = lock_name("crowd");
    let first = acquired(&holder, &lock, Duration::from_secs(60)).await;
    let client = backend(&url).await;
    let locker = Locker::new(client.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(scaled(Duration::from_secs(240)))
        // Long re-checks: waiters must be woken by the store, not by polling.
        .recheck(Duration::from_secs(30))
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(2),
        ));
    let rss_before = peak_rss();
    let served = Arc::new(Mutex::new(Vec::with_capacity(WAITERS)));
    let mut tasks = Vec::with_capacity(WAITERS);
    for i in 0..WAITERS {
        let (locker, lock, served) = (locker.clone(), lock.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locker.acquire(&lock).await.expect("every waiter is served");
            served.lock().unwrap().push((i, guard.fencing_token()));
            guard.release().await.expect("release");
        }));
        // Arrival order is the order they joined the line: the first one
        // looks at the lock before it joins; the others join at once (on
        // this single-threaded runtime, as soon as the spawner yields).
        if i == 0 {
            until(
                Duration::from_secs(10),
                "the first waiter in line",
                || async { testing::waiting(&client) == 1 },
            )
            .await;
        } else {
            tokio::task::yield_now().await;
            assert_eq!(
                testing::waiting(&client),
                i + 1,
                "waiter {i} joined the line"
            );
        }
    }
    let conn = PgPool::connect(&shared_url()).await.unwrap();
    let connections: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&conn)
            .await
            .unwrap();
    let released = Instant::now();
    holder.release(&first).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let took = released.elapsed();
    let most: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&conn)
            .await
            .unwrap();
    let grew = peak_rss().saturating_sub(rss_before);
    eprintln!(
        "{WAITERS} waiters served in {took:?} over {} connections; peak RSS grew {:.1} MB",
        connections.max(most),
        grew as f64 / 1e6
    );
    assert!(
        connections.max(most) <= i64::from(POOL) + 3,
        "{connections} connections while waiting, {most} after (pool {POOL} + listener + 2 turnstiles)"
    );
    let served = served.lock().unwrap().clone();
    assert_eq!(served.len(), WAITERS);
    assert!(
        served
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
        "grants in arrival order, fences growing"
    );
    assert!(served[0].1 > first.fence());
    assert_eq!(
        testing::waiting(&client),
        0,
        "no registration outlives its waiter"
    );
    assert!(
        grew < 200 * 1024 * 1024,
        "memory grew {grew} bytes for {WAITERS} waiters"
    );
}

/// An uncontended acquire+release (a waiting `acquire`, as `Locker` does)
/// is one statement each; a `try_acquire` of a held lock is one statement
/// that writes nothing. Prints the server's CPU per cycle.
#[tokio::test]
async fn uncontended_cycles_cost_one_statement_each_way() {
    const CYCLES: u32 = 1000;
    let store = counting_server();
    let mut observer = counting_observer(&store).await;
    let client = backend(&store.url()).await;
    let name = lock_name("uncontended");
    let ttl = Duration::from_secs(10);
    let cycle = || async {
        let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(10));
        let lease = client
            .acquire_for(&name, ttl, &wait)
            .await
            .unwrap()
            .expect("free");
        client.release(&lease).await.unwrap();
    };
    for _ in 0..50 {
        cycle().await;
    }
    reset(&mut observer).await;
    let cpu = server_cpu(&store);
    let started = Instant::now();
    for _ in 0..CYCLES {
        cycle().await;
    }
    let elapsed = started.elapsed();
    let cpu = server_cpu(&store).saturating_sub(cpu);
    let (calls, writes, ms) = statements(&mut observer, "%").await;
    let per = |x: f64| x / f64::from(CYCLES);
    eprintln!(
        "uncontended acquire+release: {:.0}/s, {:.2} statements, {:.2} writing commits, \
         {:.1} µs in statements and {:.1} µs of server CPU per cycle",
        f64::from(CYCLES) / elapsed.as_secs_f64(),
        per(calls as f64),
        per(writes as f64),
        per(ms * 1000.0),
        per(cpu.as_secs_f64() * 1e6),
    );
    assert_eq!(
        calls,
        2 * i64::from(CYCLES),
        "one statement to acquire, one to release"
    );
    assert_eq!(writes, 2 * i64::from(CYCLES), "two durable commits a cycle");

    // A try on a held lock: one statement, no write, no flush.
    let other = backend(&store.url()).await;
    let lease = acquired(&client, &name, ttl).await;
    reset(&mut observer).await;
    for _ in 0..100 {
        let attempt = other.try_acquire_for(&name, ttl).await.unwrap();
        assert!(matches!(attempt, Attempt::Held { .. }));
    }
    let (calls, writes, _) = statements(&mut observer, "WITH cur AS%").await;
    assert_eq!(
        (calls, writes),
        (100, 0),
        "a held lock costs one read-only statement"
    );
    client.release(&lease).await.unwrap();

    // A permit: one short transaction to take a slot, one statement to
    // release it; two writing statements.
    let request = LockRequest::new(
        lock_name("permits"),
        client.capabilities().effective_ttl(ttl).unwrap(),
    );
    let permit = || async {
        let lease = client
            .try_acquire_permit(&request, 2)
            .await
            .unwrap()
            .into_lease()
            .expect("a free permit");
        client.release(&lease).await.unwrap();
    };
    permit().await;
    reset(&mut observer).await;
    let cpu = server_cpu(&store);
    for _ in 0..CYCLES / 4 {
        permit().await;
    }
    let cpu = server_cpu(&store).saturating_sub(cpu);
    let (calls, writes, _) = statements(&mut observer, "%").await;
    let cycles = f64::from(CYCLES / 4);
    eprintln!(
        "permit acquire+release: {:.2} statements, {:.2} writing, {:.1} µs of server CPU per cycle",
        calls as f64 / cycles,
        writes as f64 / cycles,
        cpu.as_secs_f64() * 1e6 / cycles
    );
    assert_eq!(writes, i64::from(CYCLES / 4) * 2, "a take and a release");
}

/// Sixteen backend instances (as sixteen processes would) take turns on one
/// name for a few seconds: prints hand-offs per second and the server's
/// CPU per hand-off, next to blocking `pg_advisory_lock` on the same server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (about 10 s): run with --ignored --nocapture"]
async fn contended_handoffs() {
    const CLIENTS: usize = 16;
    let run = Duration::from_secs(4);
    let store = counting_server();
    let name = LockName::new("contended").unwrap();
    drop(counting_observer(&store).await);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(Arc::new(backend(&store.url()).await));
    }
    let cpu = server_cpu(&store);
    let until = Instant::now() + run;
    let tasks: Vec<_> = clients
        .iter()
        .map(|client| {
            let (client, name) = (client.clone(), name.clone());
            tokio::spawn(async move {
                let mut fences = Vec::new();
                while Instant::now() < until {
                    let wait = WaitPolicy::new(until + Duration::from_secs(5));
                    let lease = client
                        .acquire_for(&name, Duration::from_secs(10), &wait)
                        .await
                        .unwrap()
                        .expect("served");
                    fences.push(lease.fence());
                    client.release(&lease).await.unwrap();
                }
                fences
            })
        })
        .collect();
    let mut fences = Vec::new();
    for task in tasks {
        fences.extend(task.await.unwrap());
    }
    let cpu = server_cpu(&store).saturating_sub(cpu);
    let handoffs = fences.len();
    let mut observer = PgConnection::connect(&store.url()).await.unwrap();
    let rows: Vec<(i64, i64, f64, String)> = sqlx::query_as(
        "SELECT calls, wal_records, total_exec_time + total_plan_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
           FROM pg_stat_statements ORDER BY calls DESC LIMIT 12",
    )
    .fetch_all(&mut observer)
    .await
    .unwrap();
    for (calls, wal, ms, query) in rows {
        eprintln!(
            "{:>8.2}/hand-off {wal:>8} WAL {ms:>9.1} ms  {query}",
            calls as f64 / fences.len() as f64
        );
    }
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), handoffs, "every grant has its own fence");
    eprintln!(
        "{CLIENTS}-way contended: {:.0} hand-offs/s, {:.1} µs of server CPU per hand-off",
        handoffs as f64 / run.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / handoffs as f64
    );

    // The floor: blocking pg_advisory_lock, one connection per client.
    let cpu = server_cpu(&store);
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut conn = PgConnection::connect(&store.url()).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut n = 0_usize;
            while Instant::now() < until {
                sqlx::query("SELECT pg_advisory_lock(42)")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                sqlx::query("SELECT pg_advisory_unlock(42)")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    let cpu = server_cpu(&store).saturating_sub(cpu);
    eprintln!(
        "{CLIENTS}-way blocking pg_advisory_lock: {:.0}/s, {:.1} µs of server CPU each",
        total as f64 / run.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / total.max(1) as f64
    );
    assert!(total > 0);
}
