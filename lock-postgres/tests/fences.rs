//! Fences only grow: across a re-created sequence, a server crash, and
//! server clock steps (judged on the server's clock).

mod support;

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::sqlx;
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, FencedResource, LockBackend, LockError, ReleaseOutcome};
use support::{acquired, connect, lock_name as name, shared_url, sql_conn, unique, with_params};
use tokio::time::Instant;

/// An operator who drops the fence sequence cannot make fences go back: the
/// re-created sequence starts above every fence left in the table.
#[tokio::test]
async fn recreated_sequence_starts_above_existing_fences() {
    let table = unique("resync");
    let url = with_params(&shared_url(), &format!("lock_table={table}"));
    let client = connect(&url).await;
    let lock = name("resync");
    let mut last = None;
    for _ in 0..5 {
        let lease = acquired(&client, &lock, Duration::from_secs(5)).await;
        last = Some(lease.fence());
        client.release(&lease).await.unwrap();
    }
    let mut conn = sql_conn(&url).await;
    sqlx::query(&format!("DROP SEQUENCE public.{table}_fence_seq"))
        .execute(&mut conn)
        .await
        .unwrap();
    let again = connect(&url).await;
    let lease = acquired(&again, &lock, Duration::from_secs(5)).await;
    assert!(
        Some(lease.fence()) > last,
        "fence {} after re-creating the sequence, {last:?} before",
        lease.fence()
    );
}

/// A connected backend whose server dies answers `Unavailable` (retryable)
/// within its operation timeout, and works again once the server is back.
#[tokio::test]
async fn server_crash_is_unavailable_then_recovers() {
    let store = postgres::start(Options::default()).expect("private postgres");
    let url = with_params(&store.url(), "lock_op_timeout_ms=1000");
    let client = connect(&url).await;
    let lock = name("crash");
    let held = acquired(&client, &lock, Duration::from_secs(60)).await;
    store.kill_now().unwrap();
    let started = Instant::now();
    let err = client
        .try_acquire_for(&name("during"), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    store.restart_now().expect("restart on the same data");
    let holder = eventually(
        Duration::from_secs(10),
        "service after the restart",
        || async { client.inspect(&lock).await.ok() },
    )
    .await;
    assert_eq!(
        holder.map(|h| h.fence),
        Some(held.fence()),
        "a held lock survives the crash with its fence"
    );
    let next = acquired(&client, &name("after"), Duration::from_secs(5)).await;
    assert!(
        next.fence() > held.fence(),
        "fences continue upward after kill -9"
    );
}

/// T3.9b: the server's clock jumps an hour forward (libfaketime): the
/// holder's lease is expired on the store's clock, its renew is refused, a
/// new holder gets a larger fence and the old holder's fenced write is
/// refused. A backward jump only lengthens leases (liveness, not safety).
#[tokio::test]
async fn server_clock_steps_are_judged_on_the_server() {
    let store =
        postgres::start(Options::default().faketime(true)).expect("postgres under faketime");
    let (a, b) = (connect(&store.url()).await, connect(&store.url()).await);
    let lock = name("clock");
    let resource = FencedResource::new(0_u32);
    let old = acquired(&a, &lock, Duration::from_secs(30)).await;
    resource.write(old.fence(), |v| *v += 1).unwrap();

    store.set_clock_offset(3600).unwrap();
    let new = acquired(&b, &lock, Duration::from_secs(30)).await;
    assert!(new.fence() > old.fence());
    assert!(
        matches!(a.renew(&old).await, Err(LockError::NotHeld { .. })),
        "the old holder learns of the loss at its next renew"
    );
    assert_eq!(a.release(&old).await.unwrap(), ReleaseOutcome::NotHeld);
    resource.write(new.fence(), |v| *v += 1).unwrap();
    assert!(resource.write(old.fence(), |v| *v += 1).is_err(), "C1");

    // Back to real time: B's lease now looks an hour longer on the store.
    store.set_clock_offset(0).unwrap();
    let left = a
        .inspect(&lock)
        .await
        .unwrap()
        .and_then(|h| h.expires_in)
        .expect("B still holds");
    assert!(left > Duration::from_secs(3600), "{left:?}");
    assert!(matches!(
        a.try_acquire_for(&lock, Duration::from_secs(5))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(b.release(&new).await.unwrap(), ReleaseOutcome::Released);
    let after = acquired(&a, &lock, Duration::from_secs(5)).await;
    assert!(after.fence() > new.fence());
}
