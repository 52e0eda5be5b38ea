//! Scale: thousands of waiters on one name share the instance's bounded
//! connections and are all served in order.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::stores::until;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx;
use lockcore::{Backoff, Locker};
use support::{acquired, connect, lock_name as name, shared_url, sql_conn, unique, with_params};
use tokio::time::Instant;

/// T2.5 / T4.10: 2,000 waiters on one backend share its pool, its single
/// LISTEN connection and two turnstile connections (they wait for one name:
/// one line in the instance, whose first waiter alone queues at the server,
/// behind the lease of the previous one), and every one of them is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_share_one_listener() {
    const WAITERS: usize = 2000;
    const POOL: u32 = 4;
    let app = unique("waiters");
    let url = with_params(
        &shared_url(),
        &format!("application_name={app}&lock_pool_size={POOL}"),
    );
    let holder = connect(&shared_url()).await;
    let lock = name("crowd");
    let first = acquired(&holder, &lock, Duration::from_secs(60)).await;
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(240))
        // Long re-checks: waiters must be woken by NOTIFY, not by polling.
        .recheck(Duration::from_secs(30))
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_secs(2),
        ));
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, lock, served) = (locker.clone(), lock.clone(), served.clone());
            tokio::spawn(async move {
                let guard = locker.acquire(&lock).await.expect("every waiter is served");
                served.lock().unwrap().push(guard.fencing_token());
                guard.release().await.expect("release");
            })
        })
        .collect();
    until(
        Duration::from_secs(60),
        "2,000 registered waiters",
        || async { backend.waiting() == WAITERS },
    )
    .await;
    let mut conn = sql_conn(&shared_url()).await;
    let connections: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(
        connections <= i64::from(POOL) + 3,
        "{connections} connections for {WAITERS} waiters (pool {POOL} + 1 listener + 2 turnstiles)"
    );
    let released = Instant::now();
    holder.release(&first).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let fences = served.lock().unwrap().clone();
    assert_eq!(fences.len(), WAITERS);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences grow in grant order"
    );
    assert!(fences[0] > first.fence());
    eprintln!(
        "{WAITERS} hand-offs in {:?} over {connections} connections",
        released.elapsed()
    );
    assert_eq!(backend.waiting(), 0, "no registration outlives its waiter");
}
