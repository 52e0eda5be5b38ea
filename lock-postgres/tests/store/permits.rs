//! Semaphores on the permits table: grants of one semaphore are serialized,
//! so a request with another count never gets a slot beside a grant in
//! flight; permit leases
//! renew in the same batch statement as locks; a permit's fence is larger
//! than every fence handed out before it, locks' included.

use std::time::Duration;

use crate::support::{
    acquired, backend, lock_name, sessions_waiting, shared_url, unique, with_params,
};
use lock_conformance::kit::poll::until;
use lock_postgres::sqlx::{self, PgPool};
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::{Attempt, LockBackend, LockError};

/// A grant that takes its time (a trigger sleeps in it) is seen by every
/// grant that comes after it: a client asking for another count while it is
/// in flight waits for it and is refused, never granted a slot beside it
/// (which a snapshot taken before that grant committed would allow).
#[tokio::test]
async fn a_grant_in_flight_is_seen_by_the_next() {
    let table = unique("slow_permits");
    let app = unique("slow");
    let url = with_params(
        &shared_url(),
        &format!("table={table}&application_name={app}"),
    );
    let (x, a, c) = (
        backend(&url).await,
        backend(&url).await,
        backend(&url).await,
    );
    let pool = PgPool::connect(&shared_url()).await.unwrap();
    // Grants for 3 permits sleep 300 ms before their transaction commits.
    for ddl in [
        format!(
            "CREATE FUNCTION public.{table}_slow() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$"
        ),
        format!(
            "CREATE TRIGGER slow BEFORE INSERT OR UPDATE ON public.{table}_permits FOR EACH ROW
             WHEN (NEW.permits = 3 AND NEW.owner IS NOT NULL) EXECUTE FUNCTION public.{table}_slow()"
        ),
    ] {
        sqlx::query(&ddl).execute(&pool).await.unwrap();
    }
    let ttl = x
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    let request = LockRequest::new(lock_name("slow"), ttl);
    let first = match x.try_acquire_permit(&request, 3).await.unwrap() {
        Attempt::Acquired(lease) => lease,
        held => panic!("a free permit: {held:?}"),
    };
    assert_eq!(first.slot(), Some(0));
    // A takes slot 1, slowly; meanwhile slot 0 is released.
    let slow = {
        let (a, request) = (a.clone(), request.clone());
        tokio::spawn(async move { a.try_acquire_permit(&request, 3).await })
    };
    until(Duration::from_secs(10), "A's grant in flight", || async {
        sessions_waiting(&pool, &app, "wait_event = 'PgSleep'").await == 1
    })
    .await;
    x.release(&first).await.unwrap();
    let refused = c.try_acquire_permit(&request, 2).await;
    assert!(
        matches!(
            refused,
            Err(LockError::PermitsMismatch {
                requested: 2,
                existing: 3,
                ..
            })
        ),
        "a 2-permit request beside a 3-permit grant in flight got {refused:?}"
    );
    let granted = slow.await.unwrap().unwrap().into_lease().expect("A's slot");
    assert_eq!(granted.slot(), Some(1));
    a.release(&granted).await.unwrap();
}

/// Locks and permits renew in one batch statement, each checked on its
/// own; a released permit is not renewed; fences of permits and locks come
/// from one sequence, so a permit's fence is above every earlier lock's.
#[tokio::test]
async fn permits_and_locks_renew_in_one_batch() {
    let client = backend(&shared_url()).await;
    let ttl = client
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    let lock = acquired(&client, &lock_name("lock"), Duration::from_secs(30)).await;
    let name = lock_name("permits");
    let request = LockRequest::new(name.clone(), ttl);
    let mut permits = Vec::new();
    for _ in 0..3 {
        match client.try_acquire_permit(&request, 3).await.unwrap() {
            Attempt::Acquired(lease) => permits.push(lease),
            held => panic!("a free permit: {held:?}"),
        }
    }
    assert!(permits[0].fence() > lock.fence());
    let mut slots: Vec<_> = permits.iter().map(|p| p.slot().unwrap()).collect();
    slots.sort();
    assert_eq!(slots, [0, 1, 2]);
    client.release(&permits[1]).await.unwrap();
    let batch = [
        permits[0].clone(),
        lock.clone(),
        permits[1].clone(),
        permits[2].clone(),
    ];
    let results = client.renew_many(&batch).await;
    let held: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(held, [true, true, false, true], "{results:?}");
    assert_eq!(results[0].as_ref().unwrap().slot(), permits[0].slot());
    let holders = client.inspect_permits(&name).await.unwrap();
    assert_eq!(holders.len(), 2);
    for lease in [&permits[0], &permits[2], &lock] {
        client.release(lease).await.unwrap();
    }
    assert!(client.inspect_permits(&name).await.unwrap().is_empty());
}
