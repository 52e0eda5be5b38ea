//! Where reader-writer locks live: one row per holder in `<table>_rw` and
//! one per waiting writer in `<table>_rw_intent`, both logged, apart from
//! the lock and the semaphore of the name, and created for deployments
//! made before them; shares renew in the lock table's batch statement.

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx;
use lockcore::backend::{Kind, LockBackendExt, LockRequest, Moment};
use lockcore::{
    Access, Attempt, FencingToken, HolderLabel, Lease, LockBackend, LockError, OwnerToken,
    ReleaseOutcome,
};
use uuid::Uuid;

use super::{attempt, locker, request, taken};
use crate::support::{
    acquired, backend, lock_name, scaled, shared_url, sql_conn, unique, with_params,
};

/// Every holder of `name` is a row of the holders table with its access,
/// fence, owner and label, and nothing of the lock or the semaphore of
/// that name; a waiting writer's intent is a row of the intents table,
/// expiring within the writer's TTL, which readers respect and the
/// writer's grant removes. Both tables are logged (durable).
#[tokio::test]
async fn holders_and_intents_are_rows_of_their_own() {
    let table = unique("rw_rows");
    let url = with_params(&shared_url(), &format!("table={table}"));
    let client = backend(&url).await;
    let mut conn = sql_conn(&url).await;
    let name = lock_name("rows");
    let label = HolderLabel::new("reader one").unwrap();
    let first = client
        .try_acquire(
            &request(&client, &name, Duration::from_secs(30), Access::Read).with_label(label),
        )
        .await
        .unwrap()
        .into_lease()
        .expect("a free read");
    let second = taken(&client, &name, Duration::from_secs(30), Access::Read).await;
    let rows: Vec<(String, i64, Uuid, Option<String>)> = sqlx::query_as(&format!(
        "SELECT access, fence, owner, label FROM public.{table}_rw WHERE name = $1 ORDER BY fence"
    ))
    .bind(name.as_str())
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let fence = |lease: &Lease| i64::try_from(lease.fence().get()).unwrap();
    assert_eq!(
        rows,
        [
            (
                "read".into(),
                fence(&first),
                first.owner().as_uuid(),
                Some("reader one".into())
            ),
            (
                "read".into(),
                fence(&second),
                second.owner().as_uuid(),
                Some(HolderLabel::this_process().as_str().into())
            ),
        ]
    );
    let elsewhere: i64 = sqlx::query_scalar(&format!(
        "SELECT (SELECT count(*) FROM public.{table} WHERE name = $1)
              + (SELECT count(*) FROM public.{table}_permits WHERE name = $1)"
    ))
    .bind(name.as_str())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        elsewhere, 0,
        "the lock and the semaphore of the name are apart"
    );

    let writer_ttl = scaled(Duration::from_secs(3));
    let writing = tokio::spawn({
        let lock = locker(&client, writer_ttl).rw_lock(&name).unwrap();
        async move { lock.write_timeout(Duration::from_secs(60)).await }
    });
    let intent_left = || async {
        sqlx::query_scalar::<_, f64>(&format!(
            "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8
               FROM public.{table}_rw_intent WHERE name = $1"
        ))
        .bind(name.as_str())
        .fetch_optional(&mut sql_conn(&url).await)
        .await
        .unwrap()
    };
    let left = eventually(Duration::from_secs(10), "the writer's intent", intent_left).await;
    assert!(
        left > 0.0 && left <= writer_ttl.as_secs_f64(),
        "an intent expiring in {left} s for a writer of TTL {writer_ttl:?}"
    );
    assert!(
        matches!(
            attempt(&client, &name, Duration::from_secs(30), Access::Read).await,
            Attempt::Held { .. }
        ),
        "a reader was granted beside a waiting writer's intent"
    );
    // Refused attempts write nothing of the holders (not even a row lock).
    let untouched = |owner: Uuid| {
        let (url, table) = (&url, &table);
        async move {
            sqlx::query_scalar::<_, String>(&format!(
                "SELECT xmax::text FROM public.{table}_rw WHERE owner = $1"
            ))
            .bind(owner)
            .fetch_one(&mut sql_conn(url).await)
            .await
            .unwrap()
                == "0"
        }
    };
    assert!(untouched(first.owner().as_uuid()).await && untouched(second.owner().as_uuid()).await);
    client.release(&first).await.unwrap();
    client.release(&second).await.unwrap();
    let write = writing
        .await
        .unwrap()
        .expect("the write once the readers left");
    assert!(write.fencing_token() > second.fence());
    assert_eq!(intent_left().await, None, "the grant removed the intent");
    assert!(matches!(
        attempt(&client, &name, Duration::from_secs(30), Access::Read).await,
        Attempt::Held { .. }
    ));
    assert!(untouched(write.lease().owner().as_uuid()).await);
    let holders = client.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].access, Some(Access::Write));
    assert_eq!(holders[0].fence, write.fencing_token());
    write.release().await.unwrap();

    let persistence: Vec<String> = sqlx::query_scalar(
        "SELECT relpersistence::text FROM pg_class WHERE oid IN (to_regclass($1), to_regclass($2))",
    )
    .bind(format!("public.{table}_rw"))
    .bind(format!("public.{table}_rw_intent"))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(persistence, ["p", "p"], "both tables are logged");
}

/// Locks, permits and reader-writer shares renew in one batch statement,
/// each checked on its own (a released share is not renewed); a share's
/// remaining time is set exactly; a share's release is owner- and
/// fence-checked.
#[tokio::test]
async fn shares_renew_in_the_lock_batch() {
    let client = backend(&shared_url()).await;
    let long = Duration::from_secs(30);
    let lock = acquired(&client, &lock_name("lock"), long).await;
    let ttl = client.capabilities().effective_ttl(long).unwrap();
    let permit = client
        .try_acquire_permit(&LockRequest::new(lock_name("permits"), ttl), 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    let name = lock_name("shares");
    let (kept, released) = (
        taken(&client, &name, long, Access::Read).await,
        taken(&client, &name, long, Access::Read).await,
    );
    client.release(&released).await.unwrap();
    let batch = [kept.clone(), lock.clone(), released.clone(), permit.clone()];
    let results = client.renew_many(&batch).await;
    let held: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(held, [true, true, false, true], "{results:?}");
    assert_eq!(results[0].as_ref().unwrap().access(), Some(Access::Read));

    let remaining = client
        .capabilities()
        .effective_remaining(Duration::from_secs(5))
        .unwrap();
    client.set_remaining(&kept, remaining).await.unwrap();
    let left = client.holders(&name, Kind::ReadWrite).await.unwrap()[0]
        .expires_in
        .unwrap();
    assert!(
        left <= Duration::from_secs(5) && left > Duration::from_secs(4),
        "{left:?} left after setting 5 s"
    );

    let forged = |owner: OwnerToken, fence: FencingToken| {
        Lease::new(name.clone(), owner, fence, kept.ttl(), Moment::now()).with_access(Access::Read)
    };
    let wrong_fence = FencingToken::new(kept.fence().get() + 1).unwrap();
    for lease in [
        forged(OwnerToken::new(), kept.fence()),
        forged(kept.owner(), wrong_fence),
    ] {
        assert_eq!(
            client.release(&lease).await.unwrap(),
            ReleaseOutcome::NotHeld
        );
        assert!(matches!(
            client.renew(&lease).await,
            Err(LockError::NotHeld { .. })
        ));
    }
    for lease in [&kept, &lock, &permit] {
        assert_eq!(
            client.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    assert_eq!(
        client.release(&kept).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
}

/// A deployment made before reader-writer locks (without their tables):
/// `connect` creates them (with `create_schema`; without, it refuses and
/// says why), leaving the rest as it was.
#[tokio::test]
async fn reader_writer_tables_come_to_older_deployments() {
    let table = unique("pre_rw");
    let url = with_params(&shared_url(), &format!("table={table}"));
    let lock = lock_name("kept");
    let held = acquired(&backend(&url).await, &lock, Duration::from_secs(30)).await;
    let mut conn = sql_conn(&url).await;
    sqlx::query(&format!(
        "DROP TABLE public.{table}_rw, public.{table}_rw_intent"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let refused = PostgresBackend::connect(&with_params(&url, "create_schema=false"))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LockError::InvalidConfig { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("reader-writer"), "{refused}");
    let client = backend(&url).await;
    assert_eq!(
        client.inspect(&lock).await.unwrap().map(|h| h.fence),
        Some(held.fence()),
        "the lock held before is still held"
    );
    let read = taken(
        &client,
        &lock_name("new"),
        Duration::from_secs(30),
        Access::Read,
    )
    .await;
    assert!(read.fence() > held.fence());
    client.release(&read).await.unwrap();
}
