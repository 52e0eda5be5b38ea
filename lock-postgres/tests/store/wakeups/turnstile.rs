//! Turnstiles against a real PostgreSQL: waiters of a name queue in the
//! server's lock manager, only the first asks for the lease, grants follow
//! arrival order, and leaving the line (cancelled, timed out, the lease
//! ending) passes the turn on and leaves nothing behind. Turnstile
//! connections are bounded per instance (waiters beyond wait without one),
//! lost ones fall back without leaks, a stuck turnstile delays but never
//! blocks, and turnstiles can be turned off. Queue states are read from
//! `pg_stat_activity`, never guessed with sleeps.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::scaled;
use lock_postgres::sqlx::{self, Connection, PgPool};
use lock_postgres::{PostgresBackend, testing};
use lockcore::backend::LockBackendExt;
use lockcore::{
    Attempt, Fairness, FencingToken, LockBackend, LockError, LockGuard, LockName, Locker,
};
use tokio::time::Instant;

use crate::support::{
    acquired, app_url, await_sessions, backend, lock_name, observer, patient, row_locked,
    sessions_waiting, shared_url, spawn_acquire, sql_conn, turnstile_sessions, unique, with_app,
    with_params,
};

/// One turnstile holder asks for the lease; every other waiting instance
/// sits in the server's queue, and stays there while the lease the
/// turnstile let in is held. Grants follow arrival order, including over a
/// releaser that asks again at once: it queues behind the others.
#[tokio::test]
async fn waiters_are_served_in_arrival_order_one_attempter_at_a_time() {
    const WAITERS: usize = 5;
    let app = unique("fifo");
    let url = app_url(&app, "");
    let name = lock_name("fifo");
    let holder = backend(&url).await;
    let first = acquired(&holder, &name, Duration::from_secs(60)).await;
    let conn = observer().await;

    let mut clients = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..WAITERS {
        let client = backend(&url).await;
        waiting.push(spawn_acquire(patient(&client), &name));
        // Arrival order is the server's queue order: wait until this
        // waiter holds the turnstile (the first) or is queued behind it.
        let queued = i64::try_from(i).unwrap();
        await_sessions(&conn, &app, "the waiter in line", |s| {
            s.holding == 1 && s.queued == queued
        })
        .await;
        clients.push(client);
    }
    // The holder re-acquires right after releasing: it must queue last.
    holder.release(&first).await.unwrap();
    let again = spawn_acquire(patient(&holder), &name);

    let mut fences: Vec<FencingToken> = Vec::new();
    for (i, task) in waiting.into_iter().enumerate() {
        let guard = task.await.unwrap().expect("served");
        // The lease keeps its turnstile: everyone behind it (the
        // re-acquiring holder too) is still queued in the server.
        let left = i64::try_from(WAITERS - i).unwrap();
        await_sessions(&conn, &app, "the line behind the grant", |s| {
            s.holding == 1 && s.queued == left
        })
        .await;
        fences.push(guard.fencing_token());
        guard.release().await.unwrap();
    }
    let last = again.await.unwrap().expect("the re-acquiring holder");
    fences.push(last.fencing_token());
    assert!(fences[0] > first.fence());
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "grants in arrival order: {fences:?}"
    );
    last.release().await.unwrap();
    await_sessions(&conn, &app, "an empty line", |s| {
        s.queued == 0 && s.holding == 0
    })
    .await;
    assert_eq!(
        holder.capabilities().fairness,
        Fairness::Fifo,
        "declared with turnstiles on"
    );
}

/// A waiter cancelled while holding the turnstile, and one cancelled while
/// queued, leave the line at once: the next waiter holds the turnstile,
/// the queued one's session leaves the server's queue, and the release
/// wakes the remaining waiter by notification. Nothing is left behind.
#[tokio::test]
async fn cancelled_waiters_pass_their_turn_on() {
    let app = unique("cancel");
    let url = app_url(&app, "");
    let name = lock_name("cancel");
    let holder = backend(&url).await;
    let lease = acquired(&holder, &name, Duration::from_secs(60)).await;
    let conn = observer().await;
    let (a, b, c) = (
        backend(&url).await,
        backend(&url).await,
        backend(&url).await,
    );
    let first = spawn_acquire(patient(&a), &name);
    await_sessions(&conn, &app, "A at the turnstile", |s| s.holding == 1).await;
    let second = spawn_acquire(patient(&b), &name);
    await_sessions(&conn, &app, "B queued", |s| s.queued == 1).await;
    let third = spawn_acquire(patient(&c), &name);
    await_sessions(&conn, &app, "C queued", |s| s.queued == 2).await;

    // A holds the turnstile: dropping its acquire hands it to B.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    await_sessions(&conn, &app, "B at the turnstile", |s| {
        s.holding == 1 && s.queued == 1
    })
    .await;
    // C is queued: dropping its acquire takes it out of the server's queue.
    third.abort();
    assert!(third.await.unwrap_err().is_cancelled());
    await_sessions(&conn, &app, "C out of the queue", |s| {
        s.holding == 1 && s.queued == 0
    })
    .await;
    assert_eq!(
        (
            testing::waiting(&a),
            testing::waiting(&b),
            testing::waiting(&c)
        ),
        (0, 1, 0)
    );

    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let guard = second.await.unwrap().expect("B is served");
    let lag = released.elapsed();
    assert!(
        lag < Duration::from_secs(2),
        "B woke {lag:?} after the release"
    );
    assert!(guard.fencing_token() > lease.fence());
    guard.release().await.unwrap();
    await_sessions(&conn, &app, "nothing left behind", |s| {
        s.holding == 0 && s.queued == 0
    })
    .await;
    assert!(matches!(
        holder
            .try_acquire_for(&name, Duration::from_secs(5))
            .await
            .unwrap(),
        Attempt::Acquired(_)
    ));
}

/// A holder let in by the turnstile keeps it until its lease ends; when an
/// administrator evicts it, its next renewal (refused) passes the turnstile
/// on, and the next waiter finds the name free at once. A holder whose
/// turnstile session dies still releases normally.
#[tokio::test]
async fn the_turnstile_passes_on_when_the_lease_ends() {
    let app = unique("passes");
    let url = app_url(&app, "");
    let name = lock_name("passes");
    let conn = observer().await;
    let ([a, b, c], first) = served_through_the_turnstile(&conn, &app, &url, &name).await;
    await_sessions(&conn, &app, "A keeps the turnstile", |s| s.holding == 1).await;
    let second = spawn_acquire(patient(&b), &name);
    await_sessions(&conn, &app, "B queued", |s| s.queued == 1).await;
    // Evicted: A's renewal is refused and the turnstile goes to B, who
    // takes the now free lock without waiting for any notification.
    a.evict(&name, None).await.unwrap();
    assert!(matches!(
        a.renew(&first.lease()).await,
        Err(LockError::NotHeld { .. })
    ));
    let guard = second.await.unwrap().expect("B is served");
    assert!(guard.fencing_token() > first.fencing_token());
    drop(first);

    // C queues behind B; B's turnstile session dies under it; B's release
    // still frees the lock, and C gets it.
    let third = spawn_acquire(patient(&c), &name);
    await_sessions(&conn, &app, "C queued", |s| s.holding == 1 && s.queued == 1).await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity a
          WHERE application_name = $1 AND state = 'idle' AND EXISTS (
            SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'
               AND l.mode = 'ExclusiveLock' AND l.granted)",
    )
    .bind(&app)
    .fetch_one(&conn)
    .await
    .unwrap();
    assert_eq!(killed, 1);
    let fence = guard.fencing_token();
    assert_eq!(
        guard.release().await.unwrap(),
        lockcore::ReleaseOutcome::Released
    );
    let last = third.await.unwrap().expect("C is served");
    assert!(last.fencing_token() > fence);
    last.release().await.unwrap();
    await_sessions(&conn, &app, "nothing left behind", |s| {
        s.holding == 0 && s.queued == 0
    })
    .await;
}

/// A release on the turnstile's connection passes the turnstile on in its
/// own statement, at its commit. While the release waits for the lock's
/// row (another transaction holds its row lock), its transaction holds the
/// turnstile and the next waiter stays queued; once it commits, the next
/// waiter is let in and served, and the releaser's session holds nothing,
/// its last statement the release: no unlock sent after it.
#[tokio::test]
async fn a_release_passes_its_turnstile_on_at_its_commit() {
    let (table, app) = (unique("passing"), unique("passing"));
    let url = with_app(&with_params(&shared_url(), &format!("table={table}")), &app);
    let name = lock_name("passing");
    let conn = observer().await;
    let ([_a, b, _c], first) = served_through_the_turnstile(&conn, &app, &url, &name).await;
    let second = spawn_acquire(patient(&b), &name);
    await_sessions(&conn, &app, "B queued behind A", |s| {
        s.holding == 1 && s.queued == 1
    })
    .await;
    // The turnstile key's holders, granted, among this test's sessions.
    let holders = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE a.application_name = $1 AND l.locktype = 'advisory'
                AND l.mode = 'ExclusiveLock' AND l.granted",
        )
        .bind(&app)
        .fetch_all(&conn)
        .await
        .unwrap()
    };
    let releaser = match holders().await[..] {
        [pid] => pid,
        ref pids => panic!("one turnstile holder expected: {pids:?}"),
    };

    let mut row_lock = row_locked(&url, &table, &name).await;
    let fence = first.fencing_token();
    let releasing = tokio::spawn(first.release());
    until(
        scaled(Duration::from_secs(10)),
        "A's release waiting for the row",
        || async {
            let waiting = format!(
                "pid = {releaser} AND wait_event_type = 'Lock' AND wait_event <> 'advisory'"
            );
            sessions_waiting(&conn, &app, &waiting).await == 1
        },
    )
    .await;
    assert_eq!(
        holders().await,
        vec![releaser],
        "the turnstile passed before the release committed"
    );
    assert_eq!(turnstile_sessions(&conn, &app).await.queued, 1, "B queued");

    sqlx::query("COMMIT").execute(&mut row_lock).await.unwrap();
    assert_eq!(
        releasing.await.unwrap().unwrap(),
        lockcore::ReleaseOutcome::Released
    );
    let guard = second.await.unwrap().expect("B is served");
    assert!(guard.fencing_token() > fence);
    let (last, holds): (String, bool) = sqlx::query_as(
        "SELECT query, EXISTS (SELECT 1 FROM pg_locks l
                                WHERE l.pid = a.pid AND l.locktype = 'advisory')
           FROM pg_stat_activity a WHERE pid = $1",
    )
    .bind(releaser)
    .fetch_one(&conn)
    .await
    .unwrap();
    assert!(
        !holds,
        "the releaser's session still holds an advisory lock"
    );
    assert!(
        last.contains("RETURNING name") && !last.contains("pg_advisory_unlock_all"),
        "a statement after the release: {last}"
    );
    guard.release().await.unwrap();
    await_sessions(&conn, &app, "nothing left behind", |s| {
        s.holding == 0 && s.queued == 0
    })
    .await;
}

/// Three clients of `url` (A, B, C, sessions of `app`), and A's guard for
/// `name`, got through the turnstile: C takes the lock with try_acquire, A
/// waits at the turnstile, C releases.
async fn served_through_the_turnstile(
    conn: &PgPool,
    app: &str,
    url: &str,
    name: &LockName,
) -> ([PostgresBackend; 3], LockGuard) {
    let (a, b, c) = (backend(url).await, backend(url).await, backend(url).await);
    let taken = acquired(&c, name, Duration::from_secs(60)).await;
    let waiting = spawn_acquire(patient(&a), name);
    await_sessions(conn, app, "A at the turnstile", |s| s.holding == 1).await;
    c.release(&taken).await.unwrap();
    let first = waiting.await.unwrap().expect("A is served");
    ([a, b, c], first)
}

/// A waiter that times out while queued leaves the server's queue.
#[tokio::test]
async fn a_queued_waiter_that_times_out_leaves_the_queue() {
    let app = unique("timeout");
    let url = app_url(&app, "");
    let name = lock_name("timeout");
    let holder = backend(&url).await;
    let lease = acquired(&holder, &name, Duration::from_secs(60)).await;
    let conn = observer().await;
    let (a, b) = (backend(&url).await, backend(&url).await);
    let first = spawn_acquire(patient(&a), &name);
    await_sessions(&conn, &app, "A at the turnstile", |s| s.holding == 1).await;
    let started = Instant::now();
    let outcome = patient(&b)
        .acquire_timeout(&name, Duration::from_millis(300))
        .await;
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "{outcome:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < scaled(Duration::from_secs(2)),
        "{took:?}"
    );
    await_sessions(&conn, &app, "B out of the queue", |s| {
        s.holding == 1 && s.queued == 0
    })
    .await;
    holder.release(&lease).await.unwrap();
    let guard = first.await.unwrap().expect("A is served");
    guard.release().await.unwrap();
}

/// Waiters of many names on one instance use at most `turnstiles`
/// connections; the others wait without one; everyone is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turnstile_connections_stay_bounded() {
    const NAMES: usize = 6;
    const PER_NAME: usize = 4;
    let app = unique("bounded");
    let url = app_url(&app, "&pool_size=2&turnstiles=2");
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
        testing::waiting(&client) == NAMES * PER_NAME
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
    assert_eq!(testing::waiting(&client), 0);
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
    assert_eq!(
        testing::waiting(&a) + testing::waiting(&b) + testing::waiting(&c),
        0
    );
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
        .bind(testing::turnstile_key(&client, &name))
        .execute(&mut *tx)
        .await
        .unwrap();

    // try_acquire ignores the turnstile.
    let started = Instant::now();
    let lease = acquired(&client, &name, Duration::from_secs(60)).await;
    assert!(started.elapsed() < scaled(Duration::from_secs(1)));

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

/// With `turnstiles=0` waiting is unordered LISTEN/NOTIFY, and the
/// backend says so.
#[tokio::test]
async fn turnstiles_can_be_turned_off() {
    let app = unique("off");
    let url = app_url(&app, "&turnstiles=0");
    let name = lock_name("off");
    let (holder, client) = (backend(&url).await, backend(&url).await);
    assert_eq!(client.capabilities().fairness, Fairness::None);
    let lease = acquired(&holder, &name, Duration::from_secs(60)).await;
    let waiter = spawn_acquire(patient(&client), &name);
    until(Duration::from_secs(10), "a waiter waiting", || async {
        testing::waiting(&client) == 1
    })
    .await;
    let conn = observer().await;
    let now = turnstile_sessions(&conn, &app).await;
    assert_eq!((now.queued, now.holding), (0, 0), "{now:?}");
    holder.release(&lease).await.unwrap();
    let guard = waiter.await.unwrap().expect("woken by notification");
    guard.release().await.unwrap();
}
