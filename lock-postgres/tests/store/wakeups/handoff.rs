//! The hand-off at the turnstile: a queued waiter's statement takes the
//! lease itself, in the server, the moment the turn comes, so no round trip
//! to the waiting client sits between one holder's release and the next
//! grant. Shown with the waiter's client cut off by a frozen network (its
//! bytes pile up, delivered later): the grant happens anyway, the lease the
//! waiter then hands out is that grant, a grant the waiter gave up on
//! meanwhile is given back at once (not left to expire), and a grant after
//! a wait longer than the TTL is renewed before it is handed out (its lease
//! counts from when the statement was sent). A role without the
//! `TEMPORARY` privilege queues plainly, in order all the same.

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::postgres;
use lock_postgres::PostgresBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{FencingToken, LockBackend, LockGuard, LockName, Locker};
use tokio::task::JoinHandle;

use crate::support::{
    acquired, await_sessions, backend, lock_name, observer, patient, shared_url, spawn_acquire,
    sql_conn, unique, with_app,
};

/// A line for `name`: `first` (of its own application) holding the
/// turnstile while `blocker` holds the lease, and a waiter `queued` behind
/// it whose client reaches the server through `proxy` (sessions of
/// `app`), asking with `locker`.
struct Line {
    blocker: PostgresBackend,
    blocking: lockcore::Lease,
    first: JoinHandle<Result<LockGuard, lockcore::LockError>>,
    queued: JoinHandle<Result<LockGuard, lockcore::LockError>>,
    /// Kept for the connections' sake.
    _waiter: PostgresBackend,
    _first_client: PostgresBackend,
}

async fn line(
    name: &LockName,
    proxy: &FaultProxy,
    app: &str,
    locker: impl FnOnce(&PostgresBackend) -> Locker,
) -> Line {
    let conn = observer().await;
    let blocker = backend(&shared_url()).await;
    let blocking = acquired(&blocker, name, Duration::from_secs(60)).await;
    let first_app = unique("handoff_first");
    let first_client = backend(&with_app(&shared_url(), &first_app)).await;
    let first = spawn_acquire(patient(&first_client), name);
    await_sessions(
        &conn,
        &first_app,
        "the first waiter at the turnstile",
        |s| s.holding == 1,
    )
    .await;
    let url = with_app(&postgres::shared().url_via(proxy.addr()), app);
    let waiter = backend(&url).await;
    let queued = spawn_acquire(locker(&waiter), name);
    await_sessions(&conn, app, "the waiter queued behind it", |s| s.queued == 1).await;
    Line {
        blocker,
        blocking,
        first,
        queued,
        _waiter: waiter,
        _first_client: first_client,
    }
}

/// The first waiter is served and releases: the turnstile passes on at
/// the release's commit. Returns the fence it held.
async fn first_served_and_released(line: &mut Line) -> FencingToken {
    line.blocker.release(&line.blocking).await.unwrap();
    let guard = (&mut line.first)
        .await
        .unwrap()
        .expect("the first waiter is served");
    let fence = guard.fencing_token();
    guard.release().await.unwrap();
    fence
}

/// The name's holder's fence once it is held above `above`.
async fn granted_above(
    observer: &PostgresBackend,
    name: &LockName,
    above: FencingToken,
) -> FencingToken {
    eventually(
        scaled(Duration::from_secs(10)),
        "the queued waiter granted in the server",
        || async {
            observer
                .inspect(name)
                .await
                .unwrap()
                .map(|holder| holder.fence)
                .filter(|fence| *fence > above)
        },
    )
    .await
}

/// The grant happens in the server with the waiter's client frozen, and
/// the lease the waiter hands out, once its network is back, is that grant.
#[tokio::test]
async fn the_queued_statement_takes_the_lease_when_the_turn_comes() {
    let proxy = FaultProxy::start(postgres::shared().addr()).await.unwrap();
    let (app, name) = (unique("handoff"), lock_name("handoff"));
    let mut line = line(&name, &proxy, &app, patient).await;
    proxy.set(Mode::Freeze);
    let before = first_served_and_released(&mut line).await;
    let granted = granted_above(&line.blocker, &name, before).await;
    proxy.set(Mode::Pass);
    let guard = line
        .queued
        .await
        .unwrap()
        .expect("the queued waiter is served");
    assert_eq!(
        guard.fencing_token(),
        granted,
        "the lease is the queued statement's grant"
    );
    guard.release().await.unwrap();
}

/// A waiter that gives up while its queued statement is being granted
/// (its client frozen, its `acquire` dropped) gives the grant back once the
/// server answers: the name is free again long before the grant's TTL.
#[tokio::test]
async fn a_grant_nobody_takes_is_given_back() {
    let proxy = FaultProxy::start(postgres::shared().addr()).await.unwrap();
    let (app, name) = (unique("giveback"), lock_name("giveback"));
    // A TTL no bound below comes near: only a give-back frees the name.
    let ttl = Duration::from_secs(600);
    let mut line = line(&name, &proxy, &app, |b| patient(b).ttl(ttl)).await;
    proxy.set(Mode::Freeze);
    let before = first_served_and_released(&mut line).await;
    granted_above(&line.blocker, &name, before).await;
    line.queued.abort();
    assert!(line.queued.await.unwrap_err().is_cancelled());
    proxy.set(Mode::Pass);
    // Well below the TTL (only a give-back frees the name before it),
    // above the give-back's few operation timeouts.
    eventually(ttl / 4, "the grant given back", || async {
        line.blocker
            .inspect(&name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let conn = observer().await;
    await_sessions(&conn, &app, "the waiter's turnstile let go", |s| {
        s.queued == 0 && s.holding == 0
    })
    .await;
}

/// A waiter whose wait in line outlasted its TTL gets a grant whose lease,
/// counted from the statement's send, is already over: it is renewed
/// before it is handed out, so the holder gets a whole TTL.
#[tokio::test]
async fn a_grant_after_a_wait_longer_than_the_ttl_is_renewed_first() {
    let proxy = FaultProxy::start(postgres::shared().addr()).await.unwrap();
    let (app, name) = (unique("longwait"), lock_name("longwait"));
    let ttl = scaled(Duration::from_secs(2));
    let mut line = line(&name, &proxy, &app, |b| patient(b).ttl(ttl)).await;
    // The wait in line itself, longer than the waiter's TTL: the scenario
    // is time passing, not a condition to await.
    tokio::time::sleep(ttl + ttl / 4).await;
    first_served_and_released(&mut line).await;
    let guard = line
        .queued
        .await
        .unwrap()
        .expect("the queued waiter is served");
    let left = guard.lease().remaining();
    assert!(left > ttl / 2, "handed out with {left:?} of {ttl:?} left");
    assert!(!guard.lost_token().is_cancelled(), "handed out lost");
    guard.release().await.unwrap();
}

/// A role that may not create temporary objects: its turnstile sessions
/// have no `distlock_turn`, queue with a plain `pg_advisory_lock`, and its
/// waiters are served in arrival order all the same.
#[tokio::test]
async fn without_the_temporary_privilege_waiters_queue_plainly() {
    let store = postgres::shared();
    let mut admin = sql_conn(&store.url()).await;
    let (role, db, app) = (unique("notemp"), unique("notemp"), unique("notemp"));
    for statement in [
        format!("CREATE ROLE {role} LOGIN PASSWORD 'pw'"),
        format!("CREATE DATABASE {db} OWNER {role}"),
        format!("REVOKE ALL ON DATABASE {db} FROM PUBLIC, {role}"),
        format!("GRANT CONNECT, CREATE ON DATABASE {db} TO {role}"),
    ] {
        lock_postgres::sqlx::query(&statement)
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let url = format!(
        "postgres://{role}:pw@{}/{db}?application_name={app}",
        store.addr()
    );
    let name = lock_name("notemp");
    let holder = backend(&url).await;
    let lease = acquired(&holder, &name, Duration::from_secs(60)).await;
    let (a, b) = (backend(&url).await, backend(&url).await);
    let conn = observer().await;
    let first = spawn_acquire(patient(&a), &name);
    await_sessions(&conn, &app, "A at the turnstile", |s| s.holding == 1).await;
    let second = spawn_acquire(patient(&b), &name);
    await_sessions(&conn, &app, "B queued", |s| s.queued == 1).await;
    let plain: i64 = lock_postgres::sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE application_name = $1 AND wait_event = 'advisory'
            AND query LIKE 'SELECT pg_advisory_lock(%'",
    )
    .bind(&app)
    .fetch_one(&conn)
    .await
    .unwrap();
    assert_eq!(plain, 1, "B queued with a plain advisory lock");
    holder.release(&lease).await.unwrap();
    let a = first.await.unwrap().expect("A is served");
    let fence_a = a.fencing_token();
    a.release().await.unwrap();
    let b = second.await.unwrap().expect("B is served");
    assert!(lease.fence() < fence_a && fence_a < b.fencing_token());
    b.release().await.unwrap();
}
