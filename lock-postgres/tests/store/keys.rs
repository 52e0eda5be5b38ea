//! The lock table's objects: created once by concurrent first uses, refused
//! clearly when missing and not to be created, safe against hostile
//! identifiers and names, and purged without letting fences go back.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{
    acquired, connect, lock_name as name, shared_url, sql_conn, unique, with_params,
};
use lock_postgres::sqlx;
use lock_postgres::{PostgresBackend, PostgresConfig};
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::{Attempt, HolderLabel, LockBackend, LockError, LockName, ReleaseOutcome};

/// T4.6: hostile schema and table options are refused before any I/O, and
/// a hostile lock name is only ever data.
#[tokio::test]
async fn sql_injection_in_options_is_refused_and_names_are_data() {
    let url = shared_url();
    for (option, value) in [
        ("table", "locks\"; DROP TABLE x; --"),
        ("schema", "public\"; DROP SCHEMA public CASCADE; --"),
        ("table", "a b"),
        ("schema", "1x"),
    ] {
        let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        let err = PostgresBackend::connect(&with_params(&url, &format!("{option}={encoded}")))
            .await
            .expect_err(value);
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{value}: {err:?}"
        );
        assert!(
            err.to_string().contains("not a safe SQL identifier"),
            "{err}"
        );
    }

    let table = unique("victims");
    let mut conn = sql_conn(&url).await;
    sqlx::query(&format!("CREATE TABLE {table} (id int)"))
        .execute(&mut conn)
        .await
        .unwrap();
    let client = connect(&url).await;
    let hostile = LockName::new(format!(
        "'; DROP TABLE {table}; -- \" ); DELETE FROM distlock_locks; --"
    ))
    .unwrap();
    let lease = acquired(&client, &hostile, Duration::from_secs(30)).await;
    let other = connect(&url).await;
    assert!(matches!(
        other
            .try_acquire_for(&hostile, Duration::from_secs(30))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    assert_eq!(
        other.inspect(&hostile).await.unwrap().map(|h| h.fence),
        Some(lease.fence())
    );
    assert_eq!(
        client.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let survived: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(survived, "the table named in the lock name must survive");
    let stored: String =
        sqlx::query_scalar("SELECT name FROM public.distlock_locks WHERE name = $1")
            .bind(hostile.as_str())
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(stored, hostile.as_str(), "names are stored verbatim");
}

/// Eight backends connecting at once to a schema nobody created yet: all
/// succeed, the objects exist once, and they share one fence sequence.
#[tokio::test]
async fn concurrent_first_use_creates_the_schema_once() {
    let url = shared_url();
    let schema = unique("Locks");
    let config = PostgresConfig::from_url(&url)
        .unwrap()
        .schema(&schema)
        .table("Leases");
    let connecting: Vec<_> = (0..8)
        .map(|_| tokio::spawn(PostgresBackend::connect_with(config.clone())))
        .collect();
    let mut backends = Vec::new();
    for task in connecting {
        backends.push(task.await.unwrap().expect("concurrent connect"));
    }
    assert_eq!(backends[0].table(), format!("\"{schema}\".\"Leases\""));
    let mut conn = sql_conn(&url).await;
    let objects: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = $1 AND c.relname IN ('Leases', 'Leases_fence_seq', 'resource_fence')",
    )
    .bind(&schema)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(objects, 3);
    let lock = name("shared-sequence");
    let mut last = 0;
    for backend in &backends {
        let lease = match backend
            .try_acquire_for(&lock, Duration::from_secs(5))
            .await
            .unwrap()
        {
            Attempt::Acquired(lease) => lease,
            other => panic!("{other:?}"),
        };
        assert!(lease.fence().get() > last, "fences grow across instances");
        last = lease.fence().get();
        backend.release(&lease).await.unwrap();
    }
}

/// With `create_schema` off, a missing table is a configuration error that
/// says what to do, not a failure at first use.
#[tokio::test]
async fn missing_objects_without_create_schema_are_a_config_error() {
    let url = with_params(
        &shared_url(),
        &format!("table={}&create_schema=false", unique("absent")),
    );
    let err = PostgresBackend::connect(&url).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("create_schema"), "{err}");
}

/// A lock table taken away under a client (renamed by an operator): its
/// renewals fail for good at once (a store error, not retryable), so its
/// holders hear now instead of retrying until their deadlines.
#[tokio::test]
async fn renewals_on_a_table_taken_away_fail_for_good() {
    let table = unique("taken");
    let url = with_params(&shared_url(), &format!("table={table}"));
    let client = connect(&url).await;
    let lease = acquired(&client, &name("taken"), Duration::from_secs(30)).await;
    let mut conn = sql_conn(&url).await;
    let rename = |from: &str, to: &str| format!("ALTER TABLE public.{from} RENAME TO {to}");
    sqlx::query(&rename(&table, &format!("{table}_away")))
        .execute(&mut conn)
        .await
        .unwrap();
    let renewed = client.renew_many(std::slice::from_ref(&lease)).await;
    sqlx::query(&rename(&format!("{table}_away"), &table))
        .execute(&mut conn)
        .await
        .unwrap();
    match &renewed[..] {
        [Err(e @ LockError::Store { .. })] => assert!(!e.is_retryable(), "{e:?}"),
        other => panic!("a renewal on a missing table: {other:?}"),
    }
    client.release(&lease).await.unwrap();
}

/// `purge_free` deletes long-free rows without letting fences go back.
#[tokio::test]
async fn purge_free_keeps_fences_monotonic() {
    let table = unique("purged");
    let url = with_params(&shared_url(), &format!("table={table}"));
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let client: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let lock = name("purged");
    let held = name("still-held");
    let first = acquired(&client, &lock, Duration::from_secs(5)).await;
    client.release(&first).await.unwrap();
    let keep = acquired(&client, &held, Duration::from_secs(30)).await;
    assert_eq!(
        backend.purge_free(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    assert_eq!(backend.purge_free(Duration::ZERO).await.unwrap(), 1);
    let second = acquired(&client, &lock, Duration::from_secs(5)).await;
    assert!(second.fence() > first.fence());
    assert_eq!(
        client.inspect(&held).await.unwrap().map(|h| h.fence),
        Some(keep.fence()),
        "held rows are never purged"
    );
}

/// A table made by a version without labels: `connect` adds the label
/// columns (with `create_schema`; without it, it refuses and says why); a
/// lease written the old way shows no label, a new one shows its label,
/// and an old-style takeover of a labelled row does not inherit the label.
#[tokio::test]
async fn labels_come_to_tables_of_older_versions() {
    let table = unique("unlabelled");
    let url = with_params(&shared_url(), &format!("table={table}"));
    let mut conn = sql_conn(&url).await;
    for ddl in [
        format!("CREATE SEQUENCE public.{table}_fence_seq AS bigint MINVALUE 1 NO CYCLE"),
        format!(
            "CREATE TABLE public.{table} (
                name text COLLATE \"C\" PRIMARY KEY, owner uuid,
                fence bigint NOT NULL CHECK (fence > 0), expires_at timestamptz NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ),
    ] {
        sqlx::query(&ddl).execute(&mut conn).await.unwrap();
    }
    // An older client's grant.
    let old = name("old");
    sqlx::query(&format!(
        "INSERT INTO public.{table} VALUES ($1, gen_random_uuid(), nextval('public.{table}_fence_seq'), clock_timestamp() + interval '1 minute')"
    ))
    .bind(old.as_str())
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
    assert!(refused.to_string().contains("label"), "{refused}");

    let client = connect(&url).await;
    let shown = client.inspect(&old).await.unwrap().expect("the old grant");
    assert_eq!(shown.label, None, "written without a label");
    let label = HolderLabel::new("labelled worker").unwrap();
    let request = LockRequest::new(
        name("new"),
        client
            .capabilities()
            .effective_ttl(Duration::from_millis(200))
            .unwrap(),
    )
    .with_label(label.clone());
    let lease = client
        .try_acquire(&request)
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    assert_eq!(
        client
            .inspect(lease.name())
            .await
            .unwrap()
            .and_then(|h| h.label),
        Some(label)
    );
    // The lease expires; an older client takes the row the old way.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let taken = sqlx::query(&format!(
        "UPDATE public.{table} SET owner = gen_random_uuid(), fence = nextval('public.{table}_fence_seq'),
                expires_at = clock_timestamp() + interval '1 minute'
          WHERE name = $1 AND expires_at <= clock_timestamp()"
    ))
    .bind(lease.name().as_str())
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(taken.rows_affected(), 1);
    let holder = client
        .inspect(lease.name())
        .await
        .unwrap()
        .expect("the old-style grant");
    assert_eq!(holder.label, None, "another grant's label is not shown");
}

/// Backends of different tables of one new schema connect at once: the
/// objects they share (the schema, its `resource_fence` table) are created
/// once, without a catalog race.
#[tokio::test]
async fn tables_of_one_schema_are_created_side_by_side() {
    let schema = unique("Shared");
    let connecting: Vec<_> = (0..8)
        .map(|i| {
            let config = PostgresConfig::from_url(&shared_url())
                .unwrap()
                .schema(&schema)
                .table(format!("locks_{i}"));
            tokio::spawn(PostgresBackend::connect_with(config))
        })
        .collect();
    for task in connecting {
        task.await
            .unwrap()
            .expect("concurrent connect of another table");
    }
}
