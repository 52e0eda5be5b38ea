//! What a lock operation costs the server, measured on a private server
//! with `pg_stat_statements`: statements and WAL-flushing commits per
//! uncontended acquire+release (asserted: the lean path is one statement
//! each, and a try on a held lock writes nothing), and the server's CPU per
//! cycle and per contended hand-off (printed, for the README's numbers).

mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_postgres::sqlx::{self, Connection, PgConnection};
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, LockBackend, LockName};
use support::{
    acquired, backend, counting_observer, counting_server, lock_name, reset, server_cpu, statements,
};
use tokio::time::Instant;

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
