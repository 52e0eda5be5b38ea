//! The lock table's objects: created once by concurrent first uses, refused
//! clearly when missing and not to be created, safe against hostile
//! identifiers and names, and purged without letting fences go back.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_postgres::sqlx;
use lock_postgres::{PostgresBackend, PostgresConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend, LockError, LockName, ReleaseOutcome};
use support::{acquired, connect, lock_name as name, shared_url, sql_conn, unique, with_params};

/// T4.6: hostile schema and table options are refused before any I/O, and
/// a hostile lock name is only ever data.
#[tokio::test]
async fn sql_injection_in_options_is_refused_and_names_are_data() {
    let url = shared_url();
    for (option, value) in [
        ("lock_table", "locks\"; DROP TABLE x; --"),
        ("lock_schema", "public\"; DROP SCHEMA public CASCADE; --"),
        ("lock_table", "a b"),
        ("lock_schema", "1x"),
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
        &format!("lock_table={}&lock_create_schema=false", unique("absent")),
    );
    let err = PostgresBackend::connect(&url).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("create_schema"), "{err}");
}

/// `purge_free` deletes long-free rows without letting fences go back.
#[tokio::test]
async fn purge_free_keeps_fences_monotonic() {
    let table = unique("purged");
    let url = with_params(&shared_url(), &format!("lock_table={table}"));
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
