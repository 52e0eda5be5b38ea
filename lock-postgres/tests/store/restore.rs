//! Restoring the lock tables from an older backup (`pg_dump`, then `psql`)
//! moves the fence sequence back: fences are handed out again unless the
//! fence floor is raised before clients come back. With the floor raised,
//! every lock and permit grant is above every fence handed out before the
//! restore. Raising the floor waits for grants in flight, so it never
//! hands a fence out twice. Clients kept running across the restore are
//! let back only once the leases they held have run out: before, a holder
//! cut off still reads held while the restored table says the name is free.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{
    acquired, backend, lock_name, scaled, sessions_waiting, shared_url, sql_conn, unique,
    with_params,
};
use lock_conformance::kit::poll::until;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::postgres;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgPool};
use lock_postgres::testing;
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, FencingToken, Lease, LockBackend, Locker};
use tokio::time::Instant;

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

/// Drops the lock table, its permits, epoch and reader-writer tables and
/// its sequence, and loads the dump at `dump` in their place.
async fn restore(url: &str, table: &str, dump: &Path) {
    let mut conn = sql_conn(url).await;
    for drop in [
        format!(
            "DROP TABLE public.{table}, public.{table}_permits, public.{table}_epoch,
                        public.{table}_rw, public.{table}_rw_intent"
        ),
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
    let backend_url = with_params(&url, &format!("table={table}"));
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
        &format!("table={table}&application_name={app}"),
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
    until(
        Duration::from_secs(10),
        "the floor waiting for the grant",
        || async { sessions_waiting(&observer, &app, "wait_event_type = 'Lock'").await == 1 },
    )
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

/// What the clients of the restore tests see: the lock table `table` on
/// the shared server, reached through a fault proxy (the operator keeps
/// the store away from them), every session tagged `app`.
struct Clients {
    table: String,
    app: String,
    proxy: FaultProxy,
    admin_url: String,
    url: String,
}

impl Clients {
    async fn new(op_timeout: Duration) -> Clients {
        let store = postgres::shared();
        let proxy = FaultProxy::start(store.addr()).await.unwrap();
        let (table, app) = (unique("live"), unique("live"));
        let admin_url = with_params(&store.url(), &format!("table={table}"));
        let url = with_params(
            &store.url_via(proxy.addr()),
            &format!(
                "table={table}&application_name={app}&timeout={}ms",
                op_timeout.as_millis()
            ),
        );
        Clients {
            table,
            app,
            proxy,
            admin_url,
            url,
        }
    }

    /// Keeps the clients away: their link goes silent, and their sessions
    /// are ended (none may still hold a transaction open on the tables).
    async fn cut_off(&self) {
        self.proxy.set(Mode::Blackhole);
        let mut conn = sql_conn(&shared_url()).await;
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&self.app)
        .execute(&mut conn)
        .await
        .unwrap();
    }

    /// The largest fence handed out so far: the sequence's last value.
    async fn largest_fence(&self) -> FencingToken {
        let mut conn = sql_conn(&shared_url()).await;
        let last: i64 = sqlx::query_scalar(&format!(
            "SELECT last_value FROM public.{}_fence_seq",
            self.table
        ))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        FencingToken::new(u64::try_from(last).unwrap()).unwrap()
    }
}

/// Clients kept running across a restore, with the procedure of
/// docs/operations.md §5: a holder that keeps renewing its lock and a
/// waiter of the same lock, both cut off (link silent, sessions ended)
/// before the largest fence is read and the backup restored, and let back
/// only once the floor is raised *and* the holder's lease has run out on
/// its own clock (its guard reads lost). Fences never repeat, and the
/// waiter gets the lock only after the holder's guard let go of it.
#[tokio::test]
async fn running_clients_across_a_restore_never_see_two_holders() {
    let ttl = scaled(Duration::from_secs(2));
    let clients = Clients::new(ttl / 4).await;
    let (holder, waiter) = (backend(&clients.url).await, backend(&clients.url).await);
    let admin = backend(&clients.admin_url).await;
    let name = lock_name("live");
    grants(&admin, "before").await;
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("locks.sql");
    let table_glob = format!("public.{}*", clients.table);
    run(
        "pg_dump",
        &[
            "-d",
            &shared_url(),
            "--table",
            &table_glob,
            "-f",
            dump.to_str().unwrap(),
        ],
    );
    // After the backup: grants a resource may have recorded, and the lock
    // the holder keeps renewing while the waiter waits for it.
    for i in 0..3 {
        grants(&admin, &format!("after-{i}")).await;
    }
    let guard = Locker::new(holder.clone())
        .ttl(ttl)
        .acquire(&name)
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let locker = Locker::new(waiter.clone())
            .ttl(ttl)
            .max_wait(Duration::from_secs(120));
        let name = name.clone();
        async move {
            let guard = locker.acquire(&name).await;
            (guard, Instant::now())
        }
    });
    until(Duration::from_secs(10), "the waiter waiting", || async {
        testing::waiting(&waiter) == 1
    })
    .await;
    // Renewals go on for a while.
    tokio::time::sleep(ttl).await;
    assert!(guard.is_held());

    // The procedure: clients away, the largest fence noted, the restore,
    // the floor above it, and a TTL for every lease held to run out.
    clients.cut_off().await;
    let largest = clients.largest_fence().await;
    assert!(largest >= guard.fencing_token());
    restore(&shared_url(), &clients.table, &dump).await;
    admin.raise_fence_floor(largest).await.unwrap();
    let lost = tokio::time::timeout(scaled(ttl * 2), guard.lost())
        .await
        .expect("the cut-off holder's guard lets go within its TTL");
    let lost_at = Instant::now();
    eprintln!("the holder's guard let go ({lost}); reopening");
    clients.proxy.set(Mode::Pass);
    // A client let in at once finds the name free (the backup is from
    // before the holder's grant), and the holder already let go.
    if let Attempt::Acquired(first) = admin.try_acquire_for(&name, ttl).await.unwrap() {
        assert!(
            !guard.is_held(),
            "S1: the cut-off holder's guard reads held while another client holds the name"
        );
        assert!(
            first.fence() > largest,
            "{} after the floor {largest}",
            first.fence()
        );
        admin.release(&first).await.unwrap();
    }

    let (next, got_at) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the waiter gets the lock once the store is back")
        .unwrap();
    let next = next.expect("the waiter's acquire");
    assert!(
        got_at > lost_at,
        "the waiter got the lock while the holder's guard read held"
    );
    assert!(!guard.is_held(), "S1: two guards read held");
    assert!(
        next.fencing_token() > largest,
        "the waiter's fence {} repeats one handed out before ({largest})",
        next.fencing_token()
    );
    next.release().await.unwrap();
    // The holder's process is still alive: its next grant is above too.
    let again = Locker::new(holder.clone())
        .ttl(ttl)
        .acquire(&name)
        .await
        .unwrap();
    assert!(again.fencing_token() > largest);
    again.release().await.unwrap();
    for lease in grants(&holder, "after-restore").await {
        assert!(
            lease.fence() > largest,
            "{} after the floor {largest}",
            lease.fence()
        );
    }
}

/// Why the procedure waits a TTL before letting running clients back: a
/// holder cut off before the restore still reads held until its lease runs
/// out on its own clock, while the restored table (from before its grant)
/// says the name is free. A client let in at once takes it: two holders,
/// fences in order or not.
#[tokio::test]
async fn reopening_before_the_leases_ran_out_gives_two_holders() {
    let ttl = scaled(Duration::from_secs(30));
    let clients = Clients::new(Duration::from_millis(500)).await;
    let holder = backend(&clients.url).await;
    let admin = backend(&clients.admin_url).await;
    let name = lock_name("early");
    grants(&admin, "before").await;
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("locks.sql");
    let table_glob = format!("public.{}*", clients.table);
    run(
        "pg_dump",
        &[
            "-d",
            &shared_url(),
            "--table",
            &table_glob,
            "-f",
            dump.to_str().unwrap(),
        ],
    );
    let guard = Locker::new(holder.clone())
        .ttl(ttl)
        .acquire(&name)
        .await
        .unwrap();
    clients.cut_off().await;
    let largest = clients.largest_fence().await;
    restore(&shared_url(), &clients.table, &dump).await;
    admin.raise_fence_floor(largest).await.unwrap();
    // Reopened at once: a client takes the name the restore freed.
    let other = backend(&clients.admin_url).await;
    let next = acquired(&other, &name, Duration::from_secs(30)).await;
    assert!(next.fence() > largest, "the floor still holds");
    assert!(
        guard.is_held(),
        "the cut-off holder's guard reads held while another client holds the name"
    );
    other.release(&next).await.unwrap();
}
