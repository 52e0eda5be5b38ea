//! What keeps reader-writer holders apart and their fences growing: a
//! renewal in flight is seen by the next grant, the fence floor lifts
//! shares and waits for their grants in flight, and a grant whose reply
//! was lost is undone once the server answers.

use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::postgres;
use lock_postgres::sqlx::{self, Connection, PgPool};
use lockcore::backend::Kind;
use lockcore::{Access, Attempt, FencingToken, HolderLabel, LockBackend, ReleaseOutcome};
use tokio::time::Instant;

use super::{attempt, request, taken};
use crate::support::{
    backend, lock_name, scaled, sessions_waiting, shared_url, sql_conn, unique, with_params,
};

/// A renewal in flight is seen by the grant that follows it: a reader's
/// renewal that found its share live, but whose commit comes after the
/// share's old expiry (a trigger sleeps in it), is waited for, and the
/// write asked meanwhile is refused, never granted beside the renewed
/// share (which a look at the snapshot alone would allow).
#[tokio::test]
async fn a_renewal_in_flight_is_seen_by_the_next_grant() {
    let table = unique("rw_renewing");
    let app = unique("renewing");
    let url = with_params(
        &shared_url(),
        &format!("table={table}&application_name={app}"),
    );
    let (client, other) = (backend(&url).await, backend(&url).await);
    let ttl = scaled(Duration::from_secs(1));
    let pool = PgPool::connect(&shared_url()).await.unwrap();
    // Renewals of shares labelled "slow renew" sleep 0.7 TTL before they
    // write (holding the row, as every update does).
    for ddl in [
        format!(
            "CREATE FUNCTION public.{table}_slow() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep({}); RETURN NEW; END $$",
            (ttl * 7 / 10).as_secs_f64()
        ),
        format!(
            "CREATE TRIGGER slow BEFORE UPDATE ON public.{table}_rw FOR EACH ROW
             WHEN (NEW.label = 'slow renew') EXECUTE FUNCTION public.{table}_slow()"
        ),
    ] {
        sqlx::query(&ddl).execute(&pool).await.unwrap();
    }
    let name = lock_name("renewing");
    let read = client
        .try_acquire(
            &request(&client, &name, ttl, Access::Read)
                .with_label(HolderLabel::new("slow renew").unwrap()),
        )
        .await
        .unwrap()
        .into_lease()
        .expect("a free read");
    let left_below = |fraction: f64| {
        let (pool, table, owner) = (&pool, &table, read.owner().as_uuid());
        move || async move {
            sqlx::query_scalar::<_, bool>(&format!(
                "SELECT expires_at - clock_timestamp() < $2 * interval '1 second'
                   FROM public.{table}_rw WHERE owner = $1"
            ))
            .bind(owner)
            .bind(fraction * ttl.as_secs_f64())
            .fetch_one(pool)
            .await
            .unwrap()
        }
    };
    // Late in its TTL, the renewal finds the share live; it commits
    // after the share's old expiry, extending it past the write below.
    until(ttl, "the share late in its TTL", left_below(0.4)).await;
    let renewing = tokio::spawn({
        let (client, read) = (client.clone(), read.clone());
        async move { client.renew(&read).await }
    });
    until(ttl, "the renewal in flight", || async {
        sessions_waiting(&pool, &app, "wait_event = 'PgSleep'").await == 1
    })
    .await;
    until(ttl, "the share's old expiry", left_below(0.0)).await;
    assert!(!renewing.is_finished(), "the renewal committed too soon");
    let write = attempt(&other, &name, Duration::from_secs(30), Access::Write).await;
    let renewed = renewing
        .await
        .unwrap()
        .expect("the renewal of a live share");
    assert!(
        matches!(write, Attempt::Held { .. }),
        "a write granted beside a share renewed in flight: {write:?}"
    );
    client.release(&renewed).await.unwrap();
}

/// `raise_fence_floor` lifts reads and writes above the floor, and waits
/// for a reader-writer grant in flight (a transaction that drew a fence
/// and writes the holders table, as a grant does): the floor's next fence
/// is above the one it drew.
#[tokio::test]
async fn the_fence_floor_lifts_reads_and_writes() {
    let table = unique("rw_floor");
    let app = unique("rwfloor");
    let url = with_params(
        &shared_url(),
        &format!("table={table}&application_name={app}"),
    );
    let admin = backend(&url).await;
    let name = lock_name("floor");
    let long = Duration::from_secs(30);
    let read = taken(&admin, &name, long, Access::Read).await;
    let floor = FencingToken::new(read.fence().get() + 1_000_000).unwrap();
    admin.raise_fence_floor(floor).await.unwrap();
    admin.release(&read).await.unwrap();
    let write = taken(&admin, &name, long, Access::Write).await;
    assert!(
        write.fence() > floor,
        "a write at {} under the floor {floor}",
        write.fence()
    );
    admin.release(&write).await.unwrap();

    let mut grant = sql_conn(&shared_url()).await;
    let mut tx = grant.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE public.{table}_rw IN ROW EXCLUSIVE MODE"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let drawn: i64 = sqlx::query_scalar(&format!("SELECT nextval('public.{table}_fence_seq')"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let raising = {
        let admin = admin.clone();
        tokio::spawn(async move { admin.raise_fence_floor(FencingToken::new(1).unwrap()).await })
    };
    let observer = PgPool::connect(&shared_url()).await.unwrap();
    until(
        Duration::from_secs(10),
        "the floor waiting for the grant",
        || async { sessions_waiting(&observer, &app, "wait_event_type = 'Lock'").await == 1 },
    )
    .await;
    assert!(!raising.is_finished(), "the floor did not wait");
    tx.commit().await.unwrap();
    raising.await.unwrap().unwrap();
    let next = taken(&admin, &name, long, Access::Read).await;
    assert!(i64::try_from(next.fence().get()).unwrap() > drawn);
    admin.release(&next).await.unwrap();
}

/// A grant whose reply was lost (its transaction committed, the answer
/// never came back) blocks the name only until the server answers again:
/// the backend removes it in the background, owner-checked, long before
/// its TTL. (A deferred trigger holds the commit so the network can fail
/// right under it.)
#[tokio::test]
async fn a_lost_grant_reply_blocks_no_longer_than_the_network() {
    let store = postgres::shared();
    let table = unique("rw_lost");
    let app = unique("rwlost");
    let op_timeout = scaled(Duration::from_secs(1));
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let params = format!("table={table}&application_name={app}");
    let blind = backend(&format!(
        "{}&timeout={}ms&pool_size=1",
        with_params(&store.url_via(proxy.addr()), &params),
        op_timeout.as_millis()
    ))
    .await;
    let other = backend(&with_params(&store.url(), &format!("table={table}"))).await;
    let pool = PgPool::connect(&store.url()).await.unwrap();
    for ddl in [
        format!(
            "CREATE FUNCTION public.{table}_slow() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON public.{table}_rw
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.label = 'slow commit')
             EXECUTE FUNCTION public.{table}_slow()"
        ),
    ] {
        sqlx::query(&ddl).execute(&pool).await.unwrap();
    }
    let name = lock_name("lost");
    let ttl = Duration::from_secs(120);
    let slow = request(&blind, &name, ttl, Access::Write)
        .with_label(HolderLabel::new("slow commit").unwrap());
    let granting = tokio::spawn({
        let blind = blind.clone();
        async move { blind.try_acquire(&slow).await }
    });
    until(Duration::from_secs(10), "the grant committing", || async {
        sessions_waiting(&pool, &app, "wait_event = 'PgSleep'").await == 1
    })
    .await;
    proxy.set(Mode::DropDownstream);
    let err = granting.await.unwrap().expect_err("no reply, no answer");
    assert!(err.is_retryable(), "{err:?}");
    let phantom = eventually(Duration::from_secs(5), "the committed grant", || async {
        other.holders(&name, Kind::ReadWrite).await.unwrap().pop()
    })
    .await;
    assert_eq!(phantom.access, Some(Access::Write));
    let healed = Instant::now();
    proxy.set(Mode::Pass);
    let within = scaled(op_timeout * 3 + Duration::from_secs(2));
    let next = eventually(within, "the lost grant's removal", || async {
        attempt(&other, &name, Duration::from_secs(30), Access::Read)
            .await
            .into_lease()
    })
    .await;
    eprintln!("lost grant removed {:?} after healing", healed.elapsed());
    assert!(next.fence() > phantom.fence, "fences only grow");
    assert_eq!(
        other.release(&next).await.unwrap(),
        ReleaseOutcome::Released
    );
}
