//! Restoring the lock tables from an older backup (`pg_dump`, then `psql`)
//! moves the fence sequence back: fences are handed out again unless the
//! fence floor is raised before clients come back. With the floor raised,
//! every lock and permit grant is above every fence handed out before the
//! restore. Raising the floor waits for grants in flight, so it never
//! hands a fence out twice.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lock_conformance::stores::{postgres, until};
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgPool};
use lockcore::backend::LockRequest;
use lockcore::{FencingToken, Lease, LockBackend};
use support::{acquired, backend, lock_name, shared_url, sql_conn, unique, with_params};

/// Runs a PostgreSQL client program of the server's version.
fn run(program: &str, args: &[&str]) {
    let bin = postgres::bin_dir().expect("PostgreSQL binaries");
    let out = Command::new(bin.join(program))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Drops the lock table, its permits table and its sequence, and loads the
/// dump at `dump` in their place.
async fn restore(url: &str, table: &str, dump: &Path) {
    let mut conn = sql_conn(url).await;
    for drop in [
        format!("DROP TABLE public.{table}, public.{table}_permits"),
        format!("DROP SEQUENCE public.{table}_fence_seq"),
    ] {
        sqlx::query(&drop).execute(&mut conn).await.unwrap();
    }
    run(
        "psql",
        &[
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-f",
            dump.to_str().unwrap(),
        ],
    );
}

/// One lock grant and one permit grant, released at once.
async fn grants(client: &PostgresBackend, tag: &str) -> Vec<Lease> {
    let lock = acquired(client, &lock_name(tag), Duration::from_secs(30)).await;
    client.release(&lock).await.unwrap();
    let ttl = client
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    let permit = client
        .try_acquire_permit(&LockRequest::new(lock_name(tag), ttl), 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    client.release(&permit).await.unwrap();
    vec![lock, permit]
}

#[tokio::test]
async fn a_restored_backup_needs_the_fence_floor() {
    let table = unique("restored");
    let url = shared_url();
    let backend_url = with_params(&url, &format!("lock_table={table}"));
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("locks.sql");

    let client = backend(&backend_url).await;
    grants(&client, "before").await;
    run(
        "pg_dump",
        &[
            "-d",
            &url,
            "--table",
            &format!("public.{table}*"),
            "-f",
            dump.to_str().unwrap(),
        ],
    );
    // Grants after the backup: fences a resource may have recorded.
    let mut after = Vec::new();
    for i in 0..5 {
        after.extend(grants(&client, &format!("after-{i}")).await);
    }
    let highest = after.iter().map(Lease::fence).max().unwrap();
    drop(client);

    // Restored and reopened as is: fences already handed out come again.
    restore(&url, &table, &dump).await;
    let reopened = backend(&backend_url).await;
    let again = grants(&reopened, "reopened").await;
    assert!(
        again.iter().all(|l| l.fence() <= highest),
        "without the floor the restored sequence hands out old fences again: {:?} vs {highest}",
        again.iter().map(Lease::fence).collect::<Vec<_>>()
    );
    drop(reopened);

    // The procedure: restore, raise the floor above every fence in use,
    // then reopen.
    restore(&url, &table, &dump).await;
    let admin = backend(&backend_url).await;
    admin.raise_fence_floor(highest).await.unwrap();
    let client = backend(&backend_url).await;
    for lease in grants(&client, "floored").await {
        assert!(
            lease.fence() > highest,
            "{} (slot {:?}) got fence {} after the floor was raised to {highest}",
            lease.name(),
            lease.slot(),
            lease.fence()
        );
    }
}

/// Raising the floor waits for grants in flight: a transaction that holds
/// the lock table as a grant does (it drew a fence and has not committed)
/// holds the floor off, and the floor's first fence is above the one it
/// drew. (Moving the sequence while a grant draws from it could hand a
/// fence out twice.)
#[tokio::test]
async fn raising_the_floor_waits_for_grants_in_flight() {
    let table = unique("floors");
    let app = unique("floor");
    let url = with_params(
        &shared_url(),
        &format!("lock_table={table}&application_name={app}"),
    );
    let admin = backend(&url).await;
    let mut grant = sql_conn(&shared_url()).await;
    let mut tx = grant.begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE public.{table} IN ROW EXCLUSIVE MODE"))
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
    until(Duration::from_secs(10), "the floor waiting for the grant", || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(&app)
        .fetch_one(&observer)
        .await
        .unwrap();
        waiting == 1
    })
    .await;
    assert!(!raising.is_finished(), "the floor did not wait");
    tx.commit().await.unwrap();
    raising.await.unwrap().unwrap();
    let next = acquired(&admin, &lock_name("after"), Duration::from_secs(30)).await;
    assert!(
        i64::try_from(next.fence().get()).unwrap() > drawn,
        "fence {} after a grant drew {drawn}",
        next.fence()
    );
}
