//! What a lock operation costs the server, measured on a private server
//! with `pg_stat_statements`: statements and WAL-flushing commits per
//! uncontended acquire+release (asserted: the lean path is one statement
//! each, and a try on a held lock writes nothing), and the server's CPU per
//! cycle and per contended hand-off (printed, for the README's numbers).

mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::stores::Store;
use lock_conformance::stores::postgres::{self, Options};
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lockcore::backend::{LockBackendExt, WaitPolicy};
use lockcore::{Attempt, LockBackend, LockName};
use support::{acquired, backend, lock_name};
use tokio::time::Instant;

/// A private server recording every statement, utility ones included.
fn counting_server() -> Store {
    postgres::start(
        Options::default()
            .setting("shared_preload_libraries", "pg_stat_statements")
            .setting("pg_stat_statements.track", "all")
            .setting("pg_stat_statements.track_utility", "on"),
    )
    .expect("private postgres with pg_stat_statements")
}

/// The server's CPU so far: the postmaster and its children (backends and
/// background processes), exited children included, from `/proc`.
fn server_cpu(store: &Store) -> Duration {
    let root = store.pid().expect("running");
    let ticks_per_sec = 100.0; // USER_HZ on Linux
    let stat = |pid: u32| -> Option<(u32, f64)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command (which may hold spaces) in parentheses.
        let rest = &text[text.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let ppid = f[1].parse().ok()?;
        let ticks: f64 = f[11..15].iter().filter_map(|v| v.parse::<f64>().ok()).sum();
        Some((ppid, ticks))
    };
    let mut ticks = stat(root).map_or(0.0, |(_, t)| t);
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok())
            && let Some((ppid, t)) = stat(pid)
            && ppid == root
        {
            ticks += t;
        }
    }
    Duration::from_secs_f64(ticks / ticks_per_sec)
}

/// `(statements, statements that wrote WAL, server time in statements)`
/// since the last reset among statements whose text matches `like`,
/// leaving out the observer's own queries.
async fn statements(observer: &mut PgConnection, like: &str) -> (i64, i64, f64) {
    let (calls, writes, ms): (i64, i64, f64) = sqlx::query_as(
        "SELECT coalesce(sum(calls), 0)::int8,
                coalesce(sum(calls) FILTER (WHERE wal_records > 0), 0)::int8,
                coalesce(sum(total_exec_time + total_plan_time), 0)::float8
           FROM pg_stat_statements
          WHERE query NOT LIKE '%pg_stat_statements%' AND query LIKE $1",
    )
    .bind(like)
    .fetch_one(&mut *observer)
    .await
    .unwrap();
    (calls, writes, ms)
}

async fn reset(observer: &mut PgConnection) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&mut *observer)
        .await
        .unwrap();
}

/// An uncontended acquire+release (a waiting `acquire`, as `Locker` does)
/// is one statement each; a `try_acquire` of a held lock is one statement
/// that writes nothing. Prints the server's CPU per cycle.
#[tokio::test]
async fn uncontended_cycles_cost_one_statement_each_way() {
    const CYCLES: u32 = 1000;
    let store = counting_server();
    let mut observer = PgConnection::connect(&store.url()).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut observer)
        .await
        .unwrap();
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
    let mut observer = PgConnection::connect(&store.url()).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut observer)
        .await
        .unwrap();
    drop(observer);
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
