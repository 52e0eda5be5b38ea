//! Multi-locks (`try_acquire_each`): one short transaction grants every
//! lock of a batch, each a row of the lock table with its own owner, fence
//! from the sequence (above the floor) and label, as a single acquire's;
//! or it writes nothing. A batch cut off from its commit's reply is undone
//! lease by lease; batches naming their locks in any order, single
//! acquires and purges never deadlock at the server.

use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::postgres;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, PgConnection};
use lockcore::backend::{Kind, LockBackendExt, LockRequest};
use lockcore::{
    Access, AttemptEach, FencingToken, HolderLabel, Lease, LockBackend, LockError, LockName,
    ReleaseOutcome,
};
use tokio::time::Instant;
use uuid::Uuid;

use crate::support::{acquired, backend, round_trip, scaled, sql_conn, unique, with_params};

const LONG: Duration = Duration::from_secs(60);

/// A backend on a lock table of its own (and the table's name), so a test
/// can look at every row.
async fn on_own_table(prefix: &str) -> (PostgresBackend, String, String) {
    let table = unique(prefix);
    let url = with_params(&postgres::shared().url(), &format!("table={table}"));
    (backend(&url).await, url, table)
}

/// Names that sort as `parts` do (one random prefix).
fn names(parts: &[&str]) -> Vec<LockName> {
    let base = unique("multi");
    (parts.iter())
        .map(|p| LockName::new(format!("{base}/{p}")).unwrap())
        .collect()
}

/// The requests of a batch of `names`, labelled `label`.
fn batch(
    client: &PostgresBackend,
    names: &[LockName],
    ttl: Duration,
    label: &str,
) -> Vec<LockRequest> {
    let ttl = client.capabilities().effective_ttl(ttl).unwrap();
    let label = HolderLabel::new(label).unwrap();
    (names.iter())
        .map(|n| LockRequest::new(n.clone(), ttl).with_label(label.clone()))
        .collect()
}

/// Every row of the lock table, with the transaction that last wrote it
/// (`xmin`), by name: a committed write changes it even where it would
/// leave the values as they were.
async fn rows(conn: &mut PgConnection, table: &str) -> Vec<String> {
    let sql = format!("SELECT ROW(l.xmin, l.*)::text FROM public.{table} l ORDER BY name");
    sqlx::query_scalar(&sql).fetch_all(conn).await.unwrap()
}

fn fence(lease: &Lease) -> i64 {
    i64::try_from(lease.fence().get()).unwrap()
}

/// A batch is a row per lock, as a single acquire's: its own owner, label
/// and fence, each above the floor and drawn in name order (the order its
/// rows are locked in), whatever order the requests came in; the leases
/// come back in request order, and each is a lease of its own: refused to
/// others, renewed, evicted (its loss signal fires) and released alone.
#[tokio::test]
async fn a_batch_is_a_grant_per_lock_above_the_floor() {
    let (client, url, table) = on_own_table("multi_rows").await;
    let other = backend(&url).await;
    let floor = FencingToken::new(1_000_000).unwrap();
    client.raise_fence_floor(floor).await.unwrap();
    let sorted = names(&["a", "b", "c"]);
    let asked = [sorted[2].clone(), sorted[0].clone(), sorted[1].clone()];
    let AttemptEach::Acquired(leases) = client
        .try_acquire_each(&batch(&client, &asked, LONG, "batch"))
        .await
        .unwrap()
    else {
        panic!("a batch of free names was refused");
    };
    let granted: Vec<&LockName> = leases.iter().map(Lease::name).collect();
    assert_eq!(granted, asked.iter().collect::<Vec<_>>(), "request order");
    let (c, a, b) = (&leases[0], &leases[1], &leases[2]);
    assert!(floor < a.fence() && a.fence() < b.fence() && b.fence() < c.fence());
    let mut conn = sql_conn(&url).await;
    let stored: Vec<(String, Uuid, i64, String)> = sqlx::query_as(&format!(
        "SELECT name, owner, fence, label FROM public.{table}
          WHERE expires_at > clock_timestamp() ORDER BY name"
    ))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let expected: Vec<_> = [a, b, c]
        .iter()
        .map(|l| {
            let name = l.name().as_str().to_owned();
            (name, l.owner().as_uuid(), fence(l), "batch".to_owned())
        })
        .collect();
    assert_eq!(stored, expected);
    for lease in &leases {
        assert!(
            other
                .try_acquire_for(lease.name(), LONG)
                .await
                .unwrap()
                .into_lease()
                .is_none()
        );
    }
    for renewed in client.renew_many(&leases).await {
        renewed.expect("each lease renews");
    }
    // An eviction reaches the one lease it names.
    let bound = client.capabilities().eviction_notice.unwrap() + round_trip(&client).await;
    other
        .evict(b.name(), Some(b.fence()))
        .await
        .unwrap()
        .unwrap();
    let lost = b.loss_signal().expect("a loss signal per lease").clone();
    tokio::time::timeout(bound, lost.cancelled())
        .await
        .expect("the evicted member's loss signal fires");
    for lease in [a, c] {
        assert!(!lease.loss_signal().unwrap().is_cancelled());
        assert_eq!(
            client.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    assert_eq!(client.release(b).await.unwrap(), ReleaseOutcome::NotHeld);
}

/// A refused batch writes nothing. Refused by its first look (a name held
/// by a committed grant), it answers with that name and its holder's time
/// left, without a transaction: no row and no fence drawn. Refused inside
/// its transaction (a grant of the last name committed while the batch
/// waited for that row's lock, having taken the names before it), it rolls
/// back: every row is as it was, no grant of it ever committed, and the
/// names it had taken are free for others at once. (Fences its transaction
/// drew are gone: the sequence never goes back, and gaps are harmless.)
#[tokio::test]
async fn a_refused_batch_writes_nothing() {
    let (client, url, table) = on_own_table("multi_none").await;
    let other = backend(&url).await;
    let n = names(&["a-released", "b-never-held", "c-held"]);
    let released = acquired(&other, &n[0], LONG).await;
    other.release(&released).await.unwrap();
    let mut conn = sql_conn(&url).await;
    let last_fence = format!("SELECT last_value FROM public.{table}_fence_seq");
    let requests = batch(&client, &n, LONG, "batch");

    // Its first look finds `c` held.
    let held = acquired(&other, &n[2], LONG).await;
    let before = rows(&mut conn, &table).await;
    let drawn: i64 = sqlx::query_scalar(&last_fence)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    match client.try_acquire_each(&requests).await.unwrap() {
        AttemptEach::Held { name, expires_in } => {
            assert_eq!(name, n[2]);
            assert!(expires_in.is_some_and(|left| left > LONG / 2 && left <= LONG));
        }
        AttemptEach::Acquired(leases) => panic!("granted past a holder: {leases:?}"),
    }
    assert_eq!(rows(&mut conn, &table).await, before);
    let now: i64 = sqlx::query_scalar(&last_fence)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(now, drawn, "no fence drawn");
    other.release(&held).await.unwrap();

    // Inside its transaction: `c`'s row is locked by a grant not yet
    // committed (written by hand, as an acquire would), which the batch's
    // first look cannot see.
    let mut admin = sql_conn(&url).await;
    sqlx::query("BEGIN").execute(&mut admin).await.unwrap();
    sqlx::query(&format!(
        "UPDATE public.{table} SET owner = $2, fence = nextval('public.{table}_fence_seq'),
                expires_at = clock_timestamp() + interval '1 minute', label = 'admin',
                label_owner = $2
          WHERE name = $1"
    ))
    .bind(n[2].as_str())
    .bind(Uuid::new_v4())
    .execute(&mut admin)
    .await
    .unwrap();
    let before = rows(&mut conn, &table).await;
    let attempt = tokio::spawn({
        let (client, requests) = (client.clone(), requests.clone());
        async move { client.try_acquire_each(&requests).await }
    });
    // The batch waits for `c`'s row, holding `a`'s (and `b`'s new one).
    let observer = sqlx::PgPool::connect(&url).await.unwrap();
    let unlocked = format!(
        "SELECT count(*) FROM (SELECT FROM public.{table} WHERE name = $1 FOR UPDATE SKIP LOCKED) f"
    );
    until(
        scaled(Duration::from_secs(10)),
        "the batch holding a's row",
        || async {
            let free: i64 = sqlx::query_scalar(&unlocked)
                .bind(n[0].as_str())
                .fetch_one(&observer)
                .await
                .unwrap();
            free == 0
        },
    )
    .await;
    assert!(other.inspect(&n[0]).await.unwrap().is_none(), "uncommitted");
    sqlx::query("COMMIT").execute(&mut admin).await.unwrap();
    match attempt.await.unwrap().unwrap() {
        AttemptEach::Held { name, .. } => assert_eq!(name, n[2]),
        AttemptEach::Acquired(leases) => panic!("granted past a holder: {leases:?}"),
    }
    let after = rows(&mut conn, &table).await;
    let unchanged = |rows: &[String]| -> Vec<String> {
        let c = n[2].as_str();
        rows.iter().filter(|r| !r.contains(c)).cloned().collect()
    };
    assert_eq!(
        unchanged(&after),
        unchanged(&before),
        "a's and b's rows as they were"
    );
    assert_eq!(after.len(), 2, "no row for b: {after:?}");
    for name in &n[..2] {
        let lease = acquired(&other, name, LONG).await;
        assert!(lease.fence() > released.fence());
        other.release(&lease).await.unwrap();
    }
}

/// Bad batches are refused before any I/O: none, a name twice, a permit
/// or a reader-writer share among them.
#[tokio::test]
async fn bad_batches_are_refused_before_any_io() {
    let client = backend(&postgres::shared().url()).await;
    let n = names(&["a", "b"]);
    let ttl = client.capabilities().effective_ttl(LONG).unwrap();
    let lock = |name: &LockName| LockRequest::new(name.clone(), ttl);
    let bad = [
        vec![],
        vec![lock(&n[0]), lock(&n[1]), lock(&n[0])],
        vec![lock(&n[0]), lock(&n[1]).with_permits(2)],
        vec![lock(&n[0]).with_access(Access::Write), lock(&n[1])],
    ];
    for requests in bad {
        match client.try_acquire_each(&requests).await {
            Err(LockError::InvalidConfig { .. }) => {}
            other => panic!("{requests:?}: {other:?}"),
        }
    }
    for name in &n {
        assert!(client.holders(name, Kind::Lock).await.unwrap().is_empty());
    }
}

/// A batch whose `COMMIT` reply is lost (a deferred trigger holds the
/// commit up at the server while replies are cut) has taken every name for
/// owners that never learn it: each is freed by its own owner token once
/// the server answers again, far below the TTL.
#[tokio::test]
async fn a_lost_commit_reply_leaves_no_phantoms() {
    let store = postgres::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let op_timeout = scaled(Duration::from_millis(500));
    let (table, app) = (unique("multi_lost"), unique("multi_lost"));
    let url = format!(
        "{}?table={table}&application_name={app}&timeout={}ms&pool_size=1",
        store.url_via(proxy.addr()),
        op_timeout.as_millis()
    );
    let blind = PostgresBackend::connect(&url).await.unwrap();
    let other = backend(&with_params(&store.url(), &format!("table={table}"))).await;
    let n = names(&["a", "b"]);
    let mut admin = sql_conn(&store.url()).await;
    for statement in [
        format!(
            "CREATE FUNCTION public.{table}_slow() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.name = '{}' THEN PERFORM pg_sleep(1); END IF; RETURN NULL; END $$",
            n[0]
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON public.{table}
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.{table}_slow()"
        ),
    ] {
        sqlx::query(&statement).execute(&mut admin).await.unwrap();
    }
    let ttl = Duration::from_secs(120);
    let attempt = tokio::spawn({
        let (blind, requests) = (blind.clone(), batch(&blind, &n, ttl, "lost"));
        async move { blind.try_acquire_each(&requests).await }
    });
    let observer = sqlx::PgPool::connect(&store.url()).await.unwrap();
    until(
        Duration::from_secs(10),
        "the batch's COMMIT held up",
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
    for name in &n {
        let phantom = eventually(
            Duration::from_secs(10),
            "the lost grant committed",
            || async { other.inspect(name).await.unwrap() },
        )
        .await;
        assert_eq!(
            phantom.label.map(|l| l.to_string()).as_deref(),
            Some("lost")
        );
    }

    proxy.set(Mode::Pass);
    let healed = Instant::now();
    let within = scaled(op_timeout * 3 + Duration::from_secs(2));
    let requests = batch(&other, &n, LONG, "next");
    let next = eventually(within, "every phantom's removal", || async {
        match other.try_acquire_each(&requests).await.unwrap() {
            AttemptEach::Acquired(leases) => Some(leases),
            AttemptEach::Held { .. } => None,
        }
    })
    .await;
    eprintln!("phantoms freed {:?} after healing", healed.elapsed());
    for lease in next {
        assert_eq!(
            other.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

/// Batches naming the same locks in opposite orders, single acquires of
/// them and purges of their free rows, all at once: nobody is ever
/// refused with an error (a deadlock the server broke would be one), and
/// each name has one holder at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_singles_and_purges_never_deadlock() {
    const ROUNDS: usize = 40;
    let (first, url, _) = on_own_table("multi_order").await;
    let n = names(&["x", "y", "z"]);
    let mut tasks = Vec::new();
    for order in [vec![0, 1, 2], vec![2, 1, 0], vec![1, 0]] {
        let client = backend(&url).await;
        let names: Vec<LockName> = order.iter().map(|&i| n[i].clone()).collect();
        tasks.push(tokio::spawn(async move {
            let requests = batch(&client, &names, LONG, "batch");
            for _ in 0..ROUNDS {
                if let AttemptEach::Acquired(leases) = client.try_acquire_each(&requests).await? {
                    for lease in leases {
                        assert_eq!(client.release(&lease).await?, ReleaseOutcome::Released);
                    }
                }
            }
            Ok::<_, LockError>(())
        }));
    }
    let single = backend(&url).await;
    let singles = n.clone();
    tasks.push(tokio::spawn(async move {
        for i in 0..ROUNDS {
            let name = &singles[i % singles.len()];
            if let Some(lease) = single.try_acquire_for(name, LONG).await?.into_lease() {
                assert_eq!(single.release(&lease).await?, ReleaseOutcome::Released);
            }
        }
        Ok(())
    }));
    tasks.push(tokio::spawn(async move {
        for _ in 0..ROUNDS {
            first.purge_free(Duration::ZERO).await?;
        }
        Ok(())
    }));
    for task in tasks {
        tokio::time::timeout(scaled(Duration::from_secs(60)), task)
            .await
            .expect("no deadlock")
            .unwrap()
            .expect("no error");
    }
}
