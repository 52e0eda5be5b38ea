//! Turnstile connections: bounded per instance (waiters beyond wait
//! without one), lost ones fall back without leaks, a stuck turnstile
//! delays but never blocks, and turnstiles can be turned off.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection};
use lockcore::{Fairness, LockBackend, LockName, Locker};
use support::{
    acquired, app_url, await_sessions, backend, lock_name, observer, patient, shared_url,
    spawn_acquire, sql_conn, turnstile_sessions, unique,
};
use tokio::time::Instant;

/// Waiters of many names on one instance use at most `turnstiles`
/// connections; the others wait without one; everyone is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turnstile_connections_stay_bounded() {
    const NAMES: usize = 6;
    const PER_NAME: usize = 4;
    let app = unique("bounded");
    let url = app_url(&app, "&lock_pool_size=2&lock_turnstiles=2");
    let holder = backend(&shared_url()).await;
    let names: Vec<LockName> = (0..NAMES).map(|i| lock_name(&format!("n{i}"))).collect();
    let mut leases = Vec::new();
    for name in &names {
        leases.push(acquired(&holder, name, Duration::from_secs(60)).await);
    }
    let client = backend(&url).await;
    let locker = Locker::new(client.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(60))
        .recheck(Duration::from_millis(500));
    let served = Arc::new(std::sync::Mutex::new(0_usize));
    let tasks: Vec<_> = names
        .iter()
        .flat_map(|name| std::iter::repeat_n(name.clone(), PER_NAME))
        .map(|name| {
            let (locker, served) = (locker.clone(), served.clone());
            tokio::spawn(async move {
                let guard = locker.acquire(&name).await.expect("served");
                *served.lock().unwrap() += 1;
                guard.release().await.unwrap();
            })
        })
        .collect();
    until(Duration::from_secs(10), "every waiter waiting", || async {
        client.waiting() == NAMES * PER_NAME
    })
    .await;
    let conn = observer().await;
    let busy = await_sessions(&conn, &app, "two turnstiles", |s| s.holding == 2).await;
    // Pool 2 + listener 1 + turnstiles 2.
    assert!(busy.total <= 5, "{busy:?}");
    for lease in &leases {
        holder.release(lease).await.unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), NAMES * PER_NAME);
    assert_eq!(client.waiting(), 0);
    // Released turnstiles are let go of in the background.
    await_sessions(&conn, &app, "no turnstile held", |s| {
        s.total <= 5 && s.holding == 0
    })
    .await;
}

/// The server ends the turnstile sessions of two waiters (the holder and a
/// queued one): both go on waiting without it, both are served, and no
/// session stays behind in a transaction or a queue.
#[tokio::test]
async fn lost_turnstile_connections_fall_back_without_leaks() {
    let app = unique("lost");
    let url = app_url(&app, "");
    let name = lock_name("lost");
    let holder = backend(&shared_url()).await;
    let lease = acquired(&holder, &name, Duration::from_secs(60)).await;
    let conn = observer().await;
    let (a, b, c) = (
        backend(&url).await,
        backend(&url).await,
        backend(&url).await,
    );
    // Each waiter releases at once: who is served first is not fixed here.
    let cycle = |client: &PostgresBackend| {
        let locker = patient(client).recheck(Duration::from_millis(300));
        let name = name.clone();
        tokio::spawn(async move {
            let guard = locker.acquire(&name).await?;
            guard.release().await
        })
    };
    let first = cycle(&a);
    await_sessions(&conn, &app, "A at the turnstile", |s| s.holding == 1).await;
    let second = cycle(&b);
    await_sessions(&conn, &app, "B queued", |s| s.queued == 1).await;
    let third = cycle(&c);
    await_sessions(&conn, &app, "C queued", |s| s.queued == 2).await;

    // End A's (holding) and one queued session from the server side.
    let killed: i64 = sqlx::query_scalar(
        "WITH victims AS (
            (SELECT pid FROM pg_stat_activity a
              WHERE application_name = $1 AND state = 'idle' AND EXISTS (
                SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'
                   AND l.mode = 'ExclusiveLock' AND l.granted))
            UNION ALL
            (SELECT pid FROM pg_stat_activity
              WHERE application_name = $1 AND wait_event = 'advisory' LIMIT 1)
         ) SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM victims",
    )
    .bind(&app)
    .fetch_one(&conn)
    .await
    .unwrap();
    assert_eq!(killed, 2);
    // The queued survivor now holds the turnstile; nobody is queued.
    await_sessions(&conn, &app, "the survivor at the turnstile", |s| {
        s.holding == 1 && s.queued == 0
    })
    .await;

    holder.release(&lease).await.unwrap();
    for task in [first, second, third] {
        task.await.unwrap().expect("every waiter is served");
    }
    await_sessions(&conn, &app, "nothing left behind", |s| {
        s.holding == 0 && s.queued == 0
    })
    .await;
    assert_eq!(a.waiting() + b.waiting() + c.waiting(), 0);
}

/// A session that holds a name's turnstile and never moves (a hung waiter,
/// or another name or application whose advisory key collides) costs
/// waiters at most about a re-check interval once the lease is free, never
/// a stall; and `try_acquire` never queues at all.
#[tokio::test]
async fn a_stuck_turnstile_delays_but_never_blocks() {
    let app = unique("stuck");
    let url = app_url(&app, "");
    let name = lock_name("stuck");
    let client = backend(&url).await;
    let mut squatter = sql_conn(&shared_url()).await;
    let mut tx = squatter.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(client.turnstile_key(&name))
        .execute(&mut *tx)
        .await
        .unwrap();

    // try_acquire ignores the turnstile.
    let started = Instant::now();
    let lease = acquired(&client, &name, Duration::from_secs(60)).await;
    assert!(started.elapsed() < Duration::from_secs(1));

    // A waiter queues behind the squatter; once the lease has been free a
    // re-check interval, it takes it anyway.
    let recheck = Duration::from_millis(300);
    let waiter = spawn_acquire(patient(&client).recheck(recheck), &name);
    let conn = observer().await;
    await_sessions(&conn, &app, "the waiter queued", |s| s.queued == 1).await;
    let released = Instant::now();
    client.release(&lease).await.unwrap();
    let guard = waiter.await.unwrap().expect("served past the squatter");
    let lag = released.elapsed();
    assert!(
        lag < recheck * 2 + Duration::from_secs(1),
        "served {lag:?} after the release"
    );
    assert!(guard.fencing_token() > lease.fence());
    await_sessions(&conn, &app, "the waiter left the queue", |s| s.queued == 0).await;
    guard.release().await.unwrap();
    tx.rollback().await.unwrap();
}

/// With `lock_turnstiles=0` waiting is unordered LISTEN/NOTIFY, and the
/// backend says so.
#[tokio::test]
async fn turnstiles_can_be_turned_off() {
    let app = unique("off");
    let url = app_url(&app, "&lock_turnstiles=0");
    let name = lock_name("off");
    let (holder, client) = (backend(&url).await, backend(&url).await);
    assert_eq!(client.capabilities().fairness, Fairness::None);
    let lease = acquired(&holder, &name, Duration::from_secs(60)).await;
    let waiter = spawn_acquire(patient(&client), &name);
    until(Duration::from_secs(10), "a waiter waiting", || async {
        client.waiting() == 1
    })
    .await;
    let conn = observer().await;
    let now = turnstile_sessions(&conn, &app).await;
    assert_eq!((now.queued, now.holding), (0, 0), "{now:?}");
    holder.release(&lease).await.unwrap();
    let guard = waiter.await.unwrap().expect("woken by notification");
    guard.release().await.unwrap();
}
