//! How the acquire statement takes a row: an existing row by `UPDATE`, a
//! new name's by `INSERT .. ON CONFLICT DO NOTHING`. First acquires of a
//! new name racing each other get exactly one grant; an acquire that waits
//! for the row lock of a grant (and its release) committing meanwhile draws
//! its fence after that grant's, so fences never go back.

use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::scaled;
use lock_postgres::sqlx;
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend};

use crate::support::{
    acquired, backend, lock_name, observer, row_locked, sessions_waiting, shared_url, unique,
    with_app, with_params,
};

/// Contenders, each with a connection of its own, sent at once.
const CONTENDERS: usize = 8;

/// Every round is a fresh name: the row does not exist when the contenders'
/// statements start, so they race to insert it, and only one may win.
#[tokio::test]
async fn first_acquires_of_a_new_name_grant_once() {
    let url = with_params(&shared_url(), "pool_size=1");
    let mut clients = Vec::new();
    for _ in 0..CONTENDERS {
        clients.push(backend(&url).await);
    }
    for round in 0..20 {
        let name = lock_name(&format!("first-{round}"));
        // The TTL outlasts the round: a grant cannot expire and be taken
        // again by a later contender.
        let attempts = clients.iter().map(|client| {
            let (client, name) = (client.clone(), name.clone());
            tokio::spawn(
                async move { client.try_acquire_for(&name, Duration::from_secs(60)).await },
            )
        });
        let mut granted = Vec::new();
        for attempt in attempts.collect::<Vec<_>>() {
            if let Attempt::Acquired(lease) = attempt.await.unwrap().unwrap() {
                granted.push(lease);
            }
        }
        assert_eq!(granted.len(), 1, "round {round}: {granted:?}");
        clients[0].release(&granted[0]).await.unwrap();
    }
}

/// A plain transaction holds the free row's lock while an acquire waits for
/// it, then writes a grant with a fresh fence, releases it, and commits:
/// the waiting acquire judges the row on that latest version (free) and
/// takes it with a fence drawn after it, not the one it drew before waiting.
#[tokio::test]
async fn an_acquire_waiting_for_the_row_draws_its_fence_after() {
    let (table, app) = (unique("waited"), unique("waited"));
    let url = with_params(&shared_url(), &format!("table={table}"));
    let client = backend(&with_app(&url, &app)).await;
    let name = lock_name("waited");
    let first = acquired(&client, &name, Duration::from_secs(60)).await;
    client.release(&first).await.unwrap();

    let mut conn = row_locked(&url, &table, &name).await;
    let waiting = {
        let (client, name) = (client.clone(), name.clone());
        tokio::spawn(async move { client.try_acquire_for(&name, Duration::from_secs(60)).await })
    };
    let pool = observer().await;
    until(
        scaled(Duration::from_secs(10)),
        "the acquire waiting for the row",
        || {
            let pool = &pool;
            let app = &app;
            async move { sessions_waiting(pool, app, "wait_event_type = 'Lock'").await == 1 }
        },
    )
    .await;
    let between: i64 = sqlx::query_scalar(&format!(
        "UPDATE public.{table}
            SET owner = gen_random_uuid(), fence = nextval('public.{table}_fence_seq'),
                expires_at = clock_timestamp() + interval '1 minute'
          WHERE name = $1 RETURNING fence"
    ))
    .bind(name.as_str())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    sqlx::query(&format!(
        "UPDATE public.{table} SET owner = NULL, expires_at = '-infinity' WHERE name = $1"
    ))
    .bind(name.as_str())
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("COMMIT").execute(&mut conn).await.unwrap();

    let lease = match waiting.await.unwrap().unwrap() {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("the row was free once the lock was released"),
    };
    assert!(
        i64::try_from(lease.fence().get()).unwrap() > between,
        "fence {} after the grant of fence {between} it waited for",
        lease.fence()
    );
    client.release(&lease).await.unwrap();
}
