//! Wake-ups: releases notify only when somebody waits; the one listener
//! connection of a backend instance comes back after it is killed, and
//! releases still wake waiters by notification.

use lockcore::backend::Kind;
use std::time::Duration;

use crate::support::{
    acquired, backend, connect, lock_name as name, shared_url, unique, with_params,
};
use lock_conformance::kit::poll::{eventually, until};
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::postgres::PgListener;
use lock_postgres::sqlx::{self, PgPool};
use lock_postgres::testing;
use lockcore::{Backoff, LockBackend, LockName, Locker};
use tokio::time::Instant;

/// The listener connection is killed while a waiter waits: it reconnects,
/// re-listens, takes the watch key again, and the next release still wakes
/// the waiter by notification
/// (re-checks are 30 s apart, so polling cannot explain a prompt grant).
#[tokio::test]
async fn listener_reconnects_after_its_connection_is_killed() {
    let app = unique("relisten");
    let url = with_params(&shared_url(), &format!("application_name={app}"));
    let holder = connect(&shared_url()).await;
    let lock = name("relisten");
    let lease = acquired(&holder, &lock, Duration::from_secs(60)).await;
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(60))
        .recheck(Duration::from_secs(30))
        .backoff(Backoff::new(
            Duration::from_secs(30),
            Duration::from_secs(30),
        ));
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { locker.acquire(&lock).await.map(|g| (g, Instant::now())) }
    });
    let conn = PgPool::connect(&shared_url()).await.unwrap();
    until(Duration::from_secs(10), "the waiter in line", || async {
        testing::waiting(&backend) == 1
    })
    .await;
    // The waiter has its listener hold the name's watch key once it waits
    // for the lease.
    let old = eventually(Duration::from_secs(10), "the watching listener", || {
        listener_pid(&conn, &app)
    })
    .await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(old)
        .fetch_one(&conn)
        .await
        .unwrap();
    assert!(killed);
    until(
        Duration::from_secs(10),
        "the listener back, watching",
        || async {
            listener_pid(&conn, &app)
                .await
                .is_some_and(|pid| pid != old)
        },
    )
    .await;
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (guard, granted) = waiter.await.unwrap().expect("the waiter gets the lock");
    let lag = granted - released;
    assert!(
        lag < Duration::from_secs(2),
        "woken {lag:?} after the release"
    );
    assert!(guard.fencing_token() > lease.fence());
    guard.release().await.unwrap();
}

/// The backend pid of the listener connection of application `app` that
/// holds a watch key (a shared advisory lock).
async fn listener_pid(conn: &PgPool, app: &str) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l USING (pid)
          WHERE a.application_name = $1 AND l.locktype = 'advisory'
            AND l.mode = 'ShareLock' AND l.granted LIMIT 1",
    )
    .bind(app)
    .fetch_optional(conn)
    .await
    .unwrap()
}

/// Releases notify only when somebody waits: a release nobody watches sends
/// nothing (NOTIFY would serialize its commit with every other notifying
/// commit of the server), a release of a watched name wakes its watcher,
/// and once the watcher is gone, releases go quiet again. Notifications
/// arrive in commit order, so the first one a raw listener receives tells
/// which releases notified.
#[tokio::test]
async fn releases_notify_only_when_somebody_waits() {
    let app = unique("quiet");
    let holder = backend(&shared_url()).await;
    let watcher = backend(&with_params(
        &shared_url(),
        &format!("application_name={app}"),
    ))
    .await;
    let mut raw = PgListener::connect(&shared_url()).await.unwrap();
    raw.listen(testing::channel(&holder)).await.unwrap();
    let cycle = |name: LockName| {
        let holder = holder.clone();
        async move {
            let lease = acquired(&holder, &name, Duration::from_secs(30)).await;
            holder.release(&lease).await.unwrap();
        }
    };
    let prefix = unique("notified");
    let named = |s: &str| LockName::new(format!("{prefix}/{s}")).unwrap();
    let (quiet, watched, after) = (named("quiet"), named("watched"), named("after"));
    // Other tests share the server and its channel: only this test's
    // notifications count.
    let mut own = async || loop {
        let notification = raw.recv().await.unwrap();
        if notification.payload().starts_with(&prefix) {
            return notification.payload().to_owned();
        }
    };

    cycle(quiet.clone()).await;
    let wakeup = watcher
        .watch(&watched, Kind::Lock)
        .await
        .unwrap()
        .expect("a store wake-up");
    cycle(watched.clone()).await;
    assert_eq!(
        own().await,
        watched.as_str(),
        "the unwatched release must not have notified"
    );
    tokio::time::timeout(Duration::from_secs(5), wakeup)
        .await
        .expect("the watcher is woken");

    // The watcher is gone: its listener lets go of the watch key.
    let conn = PgPool::connect(&shared_url()).await.unwrap();
    until(
        Duration::from_secs(10),
        "the watch key let go of",
        || async {
            let held: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
              WHERE a.application_name = $1 AND l.locktype = 'advisory' AND l.mode = 'ShareLock'",
            )
            .bind(&app)
            .fetch_one(&conn)
            .await
            .unwrap();
            held == 0
        },
    )
    .await;
    cycle(watched.clone()).await;
    let wakeup = watcher
        .watch(&after, Kind::Lock)
        .await
        .unwrap()
        .expect("a store wake-up");
    cycle(after.clone()).await;
    assert_eq!(own().await, after.as_str());
    tokio::time::timeout(Duration::from_secs(5), wakeup)
        .await
        .expect("the watcher is woken");
}
