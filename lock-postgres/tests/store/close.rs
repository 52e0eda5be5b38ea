//! Closing a client: every lease it granted is lost at once, a waiter of it
//! ends, the clean-ups it owes the store are done, and every session it
//! opened (pool, listener, turnstiles) is gone from the server's own view
//! (`pg_stat_activity`) once `close` returns. A dropped backend's leases
//! count as lost too.

use std::time::Duration;

use crate::support::{acquired, app_url, backend, lock_name, observer, scaled, unique};
use lock_conformance::kit::poll::until;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::postgres;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, PgPool};
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, LockBackend, LockError, Locker};
use tokio::time::Instant;

/// Sessions of application `app`: `(all, waiting for an advisory lock)`.
async fn sessions_of(observer: &PgPool, app: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'advisory')
           FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(app)
    .fetch_one(observer)
    .await
    .unwrap()
}

/// A session the client closed (`Terminate` sent) leaves the server's view
/// as soon as its process has exited: a few milliseconds.
fn reaped_within() -> Duration {
    scaled(Duration::from_millis(500))
}

#[tokio::test]
async fn close_loses_every_lease_ends_waits_and_closes_every_session() {
    let (app, other_app) = (unique("closing"), unique("other"));
    let client = backend(&app_url(&app, "")).await;
    let other = backend(&app_url(&other_app, "")).await;
    let observer = observer().await;
    let ttl = Duration::from_secs(60);
    let lock = acquired(&client, &lock_name("held"), ttl).await;
    let request = LockRequest::new(
        lock_name("permit"),
        client.capabilities().effective_ttl(ttl).unwrap(),
    );
    let permit = client
        .try_acquire_permit(&request, 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    // A waiter of this client queued at a turnstile behind a waiter of
    // another client, which holds the turnstile.
    let contended = lock_name("contended");
    let held_elsewhere = acquired(&other, &contended, ttl).await;
    let ahead = wait_for(&other, &contended);
    until(
        Duration::from_secs(10),
        "the other waiter at the turnstile",
        || async {
            crate::support::turnstile_sessions(&observer, &other_app)
                .await
                .holding
                == 1
        },
    )
    .await;
    let waiter = tokio::spawn({
        let locker = Locker::new(client.clone()).max_wait(Duration::from_secs(60));
        let contended = contended.clone();
        async move { locker.acquire(&contended).await.map(drop) }
    });
    until(
        Duration::from_secs(10),
        "the waiter queued at the server",
        || async { sessions_of(&observer, &app).await.1 == 1 },
    )
    .await;
    let (before, _) = sessions_of(&observer, &app).await;
    assert!(
        before >= 3,
        "pool, listener and turnstile: {before} sessions"
    );

    client.close().await.unwrap();
    let closed_at = Instant::now();
    assert_eq!(
        sessions_of(&observer, &app).await.1,
        0,
        "the waiter's turnstile wait was cancelled before close returned"
    );
    for lease in [&lock, &permit] {
        assert!(
            lease.loss_signal().is_some_and(|lost| lost.is_cancelled()),
            "{} (slot {:?}) still reads held after close",
            lease.name(),
            lease.slot()
        );
        assert!(lease.is_expired());
    }
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter ends with close")
        .unwrap();
    assert!(
        matches!(waited, Err(LockError::Unavailable { .. })),
        "{waited:?}"
    );
    until(
        reaped_within(),
        "every session of the closed client gone",
        || async { sessions_of(&observer, &app).await.0 == 0 },
    )
    .await;
    eprintln!("sessions gone {:?} after close", closed_at.elapsed());

    for outcome in [
        client
            .try_acquire_for(&lock_name("after"), ttl)
            .await
            .map(drop),
        client.inspect(&contended).await.map(drop),
        client.release(&lock).await.map(drop),
        client.renew(&lock).await.map(drop),
    ] {
        assert!(
            matches!(outcome, Err(LockError::Unavailable { .. })),
            "a closed client must refuse work with Unavailable: {outcome:?}"
        );
    }
    client.close().await.expect("a second close is harmless");
    assert!(format!("{client:?}").contains("closed: true"));
    other.release(&held_elsewhere).await.unwrap();
    ahead.await.unwrap().expect("the other waiter goes on");
}

/// A waiter of `client` for `name`, released as soon as it gets it.
fn wait_for(
    client: &PostgresBackend,
    name: &lockcore::LockName,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let locker = Locker::new(client.clone()).max_wait(Duration::from_secs(60));
    let name = name.clone();
    tokio::spawn(async move { locker.acquire(&name).await?.release().await.map(drop) })
}

/// The case a CLI hits: a waiter times out, and its process closes the
/// client and exits right away. Nothing of it stays at the server: no
/// session, so no place in the turnstile queue (which would get the next
/// turn and keep it until the server noticed).
#[tokio::test]
async fn a_timed_out_waiter_closed_at_once_leaves_nothing() {
    let (app, holder_app) = (unique("timedout"), unique("holder"));
    let holder = backend(&app_url(&holder_app, "")).await;
    let waiter = backend(&app_url(&app, "")).await;
    let observer = observer().await;
    let name = lock_name("timed-out");
    let lease = acquired(&holder, &name, Duration::from_secs(60)).await;
    // Another waiter holds the turnstile: the one that times out is queued.
    let ahead = wait_for(&holder, &name);
    until(
        Duration::from_secs(10),
        "the first waiter at the turnstile",
        || async {
            crate::support::turnstile_sessions(&observer, &holder_app)
                .await
                .holding
                == 1
        },
    )
    .await;
    let outcome = Locker::new(waiter.clone())
        .acquire_timeout(&name, scaled(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "{outcome:?}"
    );
    waiter.close().await.unwrap();
    assert_eq!(
        sessions_of(&observer, &app).await.1,
        0,
        "a turnstile wait left in the server's queue"
    );
    until(
        reaped_within(),
        "every session of the waiter gone",
        || async { sessions_of(&observer, &app).await.0 == 0 },
    )
    .await;
    let seen = holder.inspect(&name).await.unwrap().expect("still held");
    assert_eq!(seen.fence, lease.fence());
    holder.release(&lease).await.unwrap();
    ahead.await.unwrap().expect("the first waiter gets it");
}

/// An acquire whose reply was lost left a grant for nobody; its clean-up
/// is finished by `close`: the name is free once `close` returns.
#[tokio::test]
async fn close_finishes_the_cleanup_of_a_lost_reply() {
    let store = postgres::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    // Close finishes the clean-up within the operation timeout: one that
    // a reconnect and an undo fit in on a loaded machine.
    let op_timeout = scaled(Duration::from_secs(2));
    let url = format!(
        "{}?timeout={}ms&pool_size=1",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let blind = PostgresBackend::connect(&url).await.unwrap();
    let other = backend(&store.url()).await;
    let name = lock_name("lost-then-closed");
    crate::support::warm_up(&blind).await;
    proxy.set(Mode::DropDownstream);
    let err = blind
        .try_acquire_for(&name, Duration::from_secs(120))
        .await
        .expect_err("no reply");
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        other.inspect(&name).await.unwrap().is_some(),
        "the server granted the acquire whose reply was lost"
    );
    // The cut ends: connections it left hanging are reset, new ones pass.
    // (A clean-up connecting during the cut would otherwise wait out the
    // operation timeout on a reply that never comes, and only its retry,
    // after close has given up, would free the name.)
    proxy.set(Mode::Pass);
    proxy.reset_existing();
    blind.close().await.unwrap();
    assert_eq!(
        other.inspect(&name).await.unwrap().map(|h| h.fence),
        None,
        "the grant nobody holds is gone once close returns"
    );
}

/// A backend dropped while a lease of it is still held can renew nothing:
/// the lease counts as lost at once, it does not read held to its deadline.
#[tokio::test]
async fn a_dropped_backend_loses_its_leases() {
    let client = backend(&crate::support::shared_url()).await;
    let lease = match client
        .try_acquire_for(&lock_name("dropped"), Duration::from_secs(60))
        .await
        .unwrap()
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("a fresh name is free"),
    };
    assert!(!lease.is_expired());
    drop(client);
    assert!(
        lease.is_expired(),
        "the lease of a dropped backend still reads held"
    );
}
