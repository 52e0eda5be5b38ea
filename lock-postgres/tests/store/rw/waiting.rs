//! Waiting for a reader-writer lock: a live writer's intent is kept
//! refreshed and a dead one's lapses within its TTL, closing a waiting
//! writer leaves no intent, and a writer's release wakes every reader of
//! an instance waiting for it.

use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_postgres::sqlx;
use lock_postgres::testing;
use lockcore::backend::Kind;
use lockcore::{Access, Attempt, LockBackend, LockError};
use tokio::time::Instant;

use super::{attempt, locker, taken};
use crate::support::{
    backend, lock_name, patient, round_trip, scaled, shared_url, sql_conn, unique, with_params,
};

/// A waiting writer keeps its intent alive however long it waits (each
/// attempt, at least every third of its TTL, refreshes it), and a writer
/// whose process stopped (its wait never runs again and nothing cleans up)
/// keeps readers out only until the intent lapses: within its TTL of its
/// last attempt, on the server's clock.
#[tokio::test]
async fn a_dead_writers_intent_lapses_within_its_ttl() {
    let (client, other) = (backend(&shared_url()).await, backend(&shared_url()).await);
    let name = lock_name("dead-writer");
    let held = taken(&other, &name, Duration::from_secs(30), Access::Read).await;
    let writer_ttl = scaled(Duration::from_millis(900));
    // Woken only by its own timer: re-checks are far apart.
    let lock = locker(&client, writer_ttl)
        .recheck(Duration::from_secs(30))
        .rw_lock(&name)
        .unwrap();
    let mut waiting = Box::pin(lock.write_timeout(Duration::from_secs(60)));
    // Alive for three of its TTLs: its intent is still there.
    tokio::select! {
        got = &mut waiting => panic!("a write beside a reader: {got:?}"),
        () = tokio::time::sleep(writer_ttl * 3) => {}
    }
    assert!(
        matches!(
            attempt(&other, &name, Duration::from_secs(30), Access::Read).await,
            Attempt::Held { .. }
        ),
        "a waiting writer's intent lapsed while it waited"
    );
    // The writer's process stops: the wait is never polled nor dropped.
    let died = Instant::now();
    std::mem::forget(waiting);
    let read = eventually(
        writer_ttl + round_trip(&client).await,
        "the dead writer's intent lapsing",
        || async {
            attempt(&other, &name, Duration::from_secs(30), Access::Read)
                .await
                .into_lease()
        },
    )
    .await;
    eprintln!(
        "a dead writer's intent lapsed {:?} after it died",
        died.elapsed()
    );
    other.release(&read).await.unwrap();
    other.release(&held).await.unwrap();
}

/// Closing a backend while its writer waits ends the wait (`Unavailable`)
/// and leaves no intent: once `close` returns, a reader of another client
/// is granted at once.
#[tokio::test]
async fn closing_a_waiting_writer_leaves_no_intent() {
    let table = unique("rw_close");
    let url = with_params(&shared_url(), &format!("table={table}"));
    let (writer, other) = (backend(&url).await, backend(&url).await);
    let name = lock_name("closing");
    let held = taken(&other, &name, Duration::from_secs(30), Access::Read).await;
    let waiting = tokio::spawn({
        let lock = locker(&writer, Duration::from_secs(30))
            .rw_lock(&name)
            .unwrap();
        async move { lock.write_timeout(Duration::from_secs(60)).await }
    });
    let mut conn = sql_conn(&url).await;
    let intents = format!("SELECT count(*) FROM public.{table}_rw_intent WHERE name = $1");
    let count = sqlx::query_scalar::<_, i64>(&intents).bind(name.as_str());
    until(Duration::from_secs(10), "the writer's intent", || async {
        sqlx::query_scalar::<_, i64>(&intents)
            .bind(name.as_str())
            .fetch_one(&mut sql_conn(&url).await)
            .await
            .unwrap()
            == 1
    })
    .await;
    writer.close().await.unwrap();
    assert_eq!(
        count.fetch_one(&mut conn).await.unwrap(),
        0,
        "an intent left at close"
    );
    let ended = waiting.await.unwrap();
    assert!(
        matches!(ended, Err(LockError::Unavailable { .. })),
        "{ended:?}"
    );
    let read = taken(&other, &name, Duration::from_secs(30), Access::Read).await;
    other.release(&read).await.unwrap();
    other.release(&held).await.unwrap();
}

/// One release of a writer wakes every local waiter of the name (a
/// reader-writer lock's notification wakes all the waiters of an
/// instance, not one, as a release may admit every waiting reader), and
/// they are granted at once, not at their re-checks 30 s apart.
#[tokio::test]
async fn a_writers_release_wakes_every_waiting_reader() {
    let (writer, readers) = (backend(&shared_url()).await, backend(&shared_url()).await);
    let name = lock_name("wake-all");
    let write = taken(&writer, &name, Duration::from_secs(30), Access::Write).await;
    // Three wake-ups of one instance, each in effect once returned.
    let mut wakeups = Vec::new();
    for _ in 0..3 {
        let wakeup = readers.watch(&name, Kind::ReadWrite).await.unwrap();
        wakeups.push(wakeup.expect("the backend declares notifications"));
    }
    let quiet = scaled(Duration::from_millis(200));
    assert!(
        tokio::time::timeout(quiet, &mut wakeups[0]).await.is_err(),
        "woken while the writer held"
    );
    let within = round_trip(&readers).await;
    writer.release(&write).await.unwrap();
    for (i, wakeup) in wakeups.into_iter().enumerate() {
        assert!(
            tokio::time::timeout(within, wakeup).await.is_ok(),
            "waiter {i} not woken within {within:?} of the writer's release"
        );
    }
    // Through the wait loop: readers waiting behind a writer, woken only
    // by the store (re-checks are 30 s apart), all granted after its release.
    let write = taken(&writer, &name, Duration::from_secs(30), Access::Write).await;
    let lock = patient(&readers).rw_lock(&name).unwrap();
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.read().await })
        })
        .collect();
    until(Duration::from_secs(10), "three readers waiting", || async {
        testing::watching(&readers) == 3
    })
    .await;
    writer.release(&write).await.unwrap();
    let within = within + scaled(Duration::from_secs(1));
    for reader in waiting {
        let read = tokio::time::timeout(within, reader)
            .await
            .expect("every reader granted after the release")
            .unwrap()
            .unwrap();
        assert_eq!(read.access(), Some(Access::Read));
        read.release().await.unwrap();
    }
}
