//! An acquire (or a permit acquire) whose reply is lost may have taken the
//! lock (or a slot) for an owner who will never use it. The backend removes
//! such a phantom in the background (owner-checked) once the store answers
//! again, instead of leaving the name blocked for the whole TTL. And how a
//! renewal cut off from the server fails.

use std::time::Duration;

use crate::support::{lock_name, scaled, sql_conn, unique, warm_up, with_params};
use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::{Store, postgres};
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, Lease, LockBackend, LockName, ReleaseOutcome};
use tokio::time::Instant;

/// A client behind a proxy that gives up on an operation after
/// `op_timeout`, with one pooled connection (so an acquire goes on the one
/// `warm_up` prepared), and another client straight to the store.
async fn blind_and_other(
    store: &Store,
    op_timeout: Duration,
) -> (FaultProxy, PostgresBackend, PostgresBackend) {
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let url = format!(
        "{}?timeout={}ms&pool_size=1",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let blind = PostgresBackend::connect(&url).await.unwrap();
    let other = PostgresBackend::connect(&store.url()).await.unwrap();
    (proxy, blind, other)
}

/// Heals the network and waits for `other` to be granted `name`: the
/// phantom must go within a few operation timeouts and a round of retry
/// backoff (1 s at most), far below its TTL.
async fn granted_once_healed(
    proxy: &FaultProxy,
    other: &PostgresBackend,
    name: &LockName,
    op_timeout: Duration,
) -> Lease {
    proxy.set(Mode::Pass);
    let within = scaled(op_timeout * 3 + Duration::from_secs(2));
    eventually(within, "the phantom's removal", || async {
        other
            .try_acquire_for(name, Duration::from_secs(30))
            .await
            .unwrap()
            .into_lease()
    })
    .await
}

#[tokio::test]
async fn a_lost_acquire_reply_leaves_no_phantom() {
    let store = postgres::shared();
    let op_timeout = scaled(Duration::from_millis(500));
    let (proxy, blind, other) = blind_and_other(&store, op_timeout).await;
    let name = lock_name("phantom");
    let before = match other.try_acquire_for(&name, Duration::from_secs(5)).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the free lock: {other:?}"),
    };
    other.release(&before).await.unwrap();
    warm_up(&blind).await;

    // The request reaches the server; its reply is lost.
    proxy.set(Mode::DropDownstream);
    let ttl = Duration::from_secs(120);
    let err = blind
        .try_acquire_for(&name, ttl)
        .await
        .expect_err("no reply, no answer");
    assert!(err.is_retryable(), "{err:?}");
    let phantom = other
        .inspect(&name)
        .await
        .unwrap()
        .expect("the server granted the acquire whose reply was lost");
    assert!(phantom.fence > before.fence());

    // The network heals.
    let healed = Instant::now();
    let next = granted_once_healed(&proxy, &other, &name, op_timeout).await;
    eprintln!("phantom removed {:?} after healing", healed.elapsed());
    assert!(next.fence() > phantom.fence, "fences only grow");
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released,
        "the cleanup never touches a later holder's grant"
    );
}

/// The undo of a lost grant is retried until the grant would have expired:
/// here its first try never reaches the server (the network goes dark
/// right after the acquire's request got through, before the client gave
/// up on its reply), and only a later try, once the network is back, can
/// free the name, long before the TTL.
#[tokio::test]
async fn an_undo_whose_first_try_fails_is_retried() {
    let store = postgres::shared();
    let op_timeout = scaled(Duration::from_millis(500));
    let (proxy, blind, other) = blind_and_other(&store, op_timeout).await;
    let name = lock_name("undo-retried");
    warm_up(&blind).await;

    proxy.set(Mode::DropDownstream);
    let ttl = Duration::from_secs(120);
    let acquire = tokio::spawn({
        let (blind, name) = (blind.clone(), name.clone());
        async move { blind.try_acquire_for(&name, ttl).await }
    });
    // The grant is in; the client still waits for its reply. From now on
    // nothing gets through, the undo's first try included.
    let phantom = eventually(op_timeout, "the grant at the server", || async {
        other.inspect(&name).await.unwrap()
    })
    .await;
    proxy.set(Mode::Blackhole);
    let err = acquire.await.unwrap().expect_err("no reply, no answer");
    assert!(err.is_retryable(), "{err:?}");
    // The first try is under way at once and fails within its operation
    // timeout (a checkout, then the statement).
    tokio::time::sleep(op_timeout * 3).await;
    assert_eq!(
        other.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(phantom.fence),
        "the undo got through the dark network"
    );

    let next = granted_once_healed(&proxy, &other, &name, op_timeout).await;
    assert!(next.fence() > phantom.fence, "fences only grow");
    other.release(&next).await.unwrap();
}

/// A renewal that cannot reach the server fails retryably (the renewer tries
/// again until the lease's deadline), and the next one, with the server
/// back, renews.
#[tokio::test]
async fn a_renewal_cut_off_from_the_server_fails_retryably() {
    let store = postgres::shared();
    let op_timeout = scaled(Duration::from_millis(300));
    let (proxy, blind, _) = blind_and_other(&store, op_timeout).await;
    let lease = match blind
        .try_acquire_for(&lock_name("cut-off"), Duration::from_secs(30))
        .await
    {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the free lock: {other:?}"),
    };
    proxy.set(Mode::Blackhole);
    proxy.reset_existing();
    match &blind.renew_many(std::slice::from_ref(&lease)).await[..] {
        [Err(e)] => assert!(e.is_retryable(), "{e:?}"),
        other => panic!("a renewal through a dark network: {other:?}"),
    }
    proxy.set(Mode::Pass);
    let renewed = eventually(
        scaled(op_timeout * 3 + Duration::from_secs(2)),
        "a renewal once the network is back",
        || async { blind.renew(&lease).await.ok() },
    )
    .await;
    blind.release(&renewed).await.unwrap();
}

/// The cleanup is owner-checked: a later holder's grant of the same name,
/// taken before the cleanup ran, is left alone.
#[tokio::test]
async fn the_cleanup_never_frees_a_later_grant() {
    let store = postgres::shared();
    let op_timeout = scaled(Duration::from_millis(300));
    let ttl = scaled(Duration::from_millis(400));
    let (proxy, blind, other) = blind_and_other(&store, op_timeout).await;
    let name = lock_name("later");
    warm_up(&blind).await;
    proxy.set(Mode::DropDownstream);
    blind
        .try_acquire_for(&name, ttl)
        .await
        .expect_err("no reply");
    // The phantom expires while the network is still down; another client
    // takes the name.
    let next = eventually(
        ttl + Duration::from_secs(2),
        "the phantom's expiry",
        || async {
            other
                .try_acquire_for(&name, Duration::from_secs(60))
                .await
                .unwrap()
                .into_lease()
        },
    )
    .await;
    proxy.set(Mode::Pass);
    // Whatever the cleanup does once it gets through, the later grant stays.
    blind.inspect(&name).await.ok();
    let give_up = Instant::now() + scaled(op_timeout * 3 + Duration::from_secs(2));
    while Instant::now() < give_up {
        let holder = other.inspect(&name).await.unwrap();
        assert_eq!(holder.map(|h| h.fence), Some(next.fence()), "S1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A permit acquire is one short transaction (`BEGIN` with the semaphore's
/// advisory lock, the take, `COMMIT`), so its grant is lost with the reply
/// to the `COMMIT`. A deferred trigger holds that commit up at the server
/// while the replies are cut: the slot is taken for an owner that never
/// learns it. The backend frees it once the server answers again, as it
/// frees a lock, far below the TTL.
#[tokio::test]
async fn a_lost_permit_reply_leaves_no_phantom() {
    let store = postgres::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let op_timeout = scaled(Duration::from_millis(500));
    let (table, app) = (unique("lostpermit"), unique("lostpermit"));
    let url = format!(
        "{}?table={table}&application_name={app}&timeout={}ms&pool_size=1",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let blind = PostgresBackend::connect(&url).await.unwrap();
    let other = PostgresBackend::connect(&with_params(&store.url(), &format!("table={table}")))
        .await
        .unwrap();
    let name = lock_name("phantom-permit");
    let mut admin = sql_conn(&store.url()).await;
    let observer = lock_postgres::sqlx::PgPool::connect(&store.url())
        .await
        .unwrap();
    for statement in [
        format!(
            "CREATE FUNCTION public.{table}_slow() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.name = '{name}' THEN PERFORM pg_sleep(1); END IF; RETURN NULL; END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON public.{table}_permits
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.{table}_slow()"
        ),
    ] {
        sqlx::query(&statement).execute(&mut admin).await.unwrap();
    }
    let ttl = blind
        .capabilities()
        .effective_ttl(Duration::from_secs(120))
        .unwrap();
    let request = LockRequest::new(name.clone(), ttl);
    // The permit statements prepared on the one pooled connection.
    let warm = LockRequest::new(lock_name("warm-permit"), ttl);
    let lease = blind
        .try_acquire_permit(&warm, 1)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    blind.release(&lease).await.unwrap();

    let attempt = tokio::spawn({
        let (blind, request) = (blind.clone(), request.clone());
        async move { blind.try_acquire_permit(&request, 1).await }
    });
    until(
        Duration::from_secs(10),
        "the permit's COMMIT held up",
        || async {
            let sleeping: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
              WHERE application_name = $1 AND query = 'COMMIT' AND wait_event = 'PgSleep'",
            )
            .bind(&app)
            .fetch_one(&observer)
            .await
            .unwrap();
            sleeping == 1
        },
    )
    .await;
    proxy.set(Mode::DropDownstream);
    let err = attempt.await.unwrap().expect_err("no reply, no answer");
    assert!(err.is_retryable(), "{err:?}");
    let phantom = eventually(
        Duration::from_secs(10),
        "the commit of the lost grant",
        || async { other.inspect_permits(&name).await.unwrap().pop() },
    )
    .await;

    proxy.set(Mode::Pass);
    let healed = Instant::now();
    let within = scaled(op_timeout * 3 + Duration::from_secs(2));
    let next = eventually(within, "the phantom slot's removal", || async {
        other
            .try_acquire_permit(&LockRequest::new(name.clone(), ttl), 1)
            .await
            .unwrap()
            .into_lease()
    })
    .await;
    eprintln!("phantom slot freed {:?} after healing", healed.elapsed());
    assert!(next.fence() > phantom.fence, "fences only grow");
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released,
        "the cleanup never touches a later holder's slot"
    );
}
