//! Failover to an asynchronous standby: the promoted server lacks the old
//! primary's last commits, its fence sequence among them (a sequence is
//! WAL-logged 32 values ahead, so the standby resumes at its last logged
//! batch). Fences handed out on it must still be larger than every fence
//! the old primary handed out, and a client of the new primary must see
//! that the server it talks to is not the one it held its leases on.
//!
//! A test binary of its own: it runs three servers of its own (a primary, a
//! standby and, between them, a relay that cuts replication).

#[path = "store/support.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::cases::failover::{Expect, FailoverRun, run_with_failovers};
use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::postgres::{self, Options};
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lock_postgres::{PostgresBackend, PostgresConfig};
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Failover, LockBackend};
use support::{acquired, lock_name, scaled};

/// Grants on the primary after replication is cut: more than the 32 values
/// a sequence logs ahead, so the standby's sequence is surely behind.
const GRANTS_AFTER_THE_CUT: usize = 40;

/// How far the standby replayed the primary's WAL, in bytes behind it:
/// behind all of it, releases too (they commit without waiting for their
/// flush; the WAL writer flushes them within `wal_writer_delay`).
async fn lag(primary: &mut PgConnection, standby: &mut PgConnection) -> i64 {
    let sent: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(&mut *primary)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT COALESCE(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()), 0)::bigint",
    )
    .bind(sent)
    .fetch_one(standby)
    .await
    .unwrap()
}

/// Promotes the standby `conn` is connected to, waiting until it is done.
async fn promote(conn: &mut PgConnection) {
    let promoted: bool = sqlx::query_scalar("SELECT pg_promote(true, 60)")
        .fetch_one(conn)
        .await
        .unwrap();
    assert!(promoted, "pg_promote");
}

/// Waits until the standby replayed everything the primary wrote.
async fn caught_up(primary: &mut PgConnection, standby: &mut PgConnection) {
    let deadline = tokio::time::Instant::now() + scaled(Duration::from_secs(30));
    while lag(primary, standby).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby did not catch up with the primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_grow_across_a_failover_to_an_async_standby() {
    let primary = postgres::start(Options::default()).expect("a primary");
    let old = PostgresBackend::connect(&primary.url()).await.unwrap();
    let name = lock_name("failover");
    let first = acquired(&old, &name, Duration::from_secs(60)).await;
    old.release(&first).await.unwrap();

    // A standby streaming through a relay, caught up, then cut off.
    let relay = FaultProxy::start(primary.addr()).await.unwrap();
    let standby = postgres::start_standby(relay.addr(), Options::default()).expect("a standby");
    let mut on_primary = PgConnection::connect(&primary.url()).await.unwrap();
    let mut on_standby = PgConnection::connect(&standby.url()).await.unwrap();
    caught_up(&mut on_primary, &mut on_standby).await;
    relay.set(Mode::Blackhole);

    // Grants the standby never sees; the last one is held.
    let mut issued = Vec::new();
    for _ in 1..GRANTS_AFTER_THE_CUT {
        let lease = acquired(&old, &name, Duration::from_secs(60)).await;
        issued.push(lease.fence());
        old.release(&lease).await.unwrap();
    }
    let held = acquired(&old, &name, Duration::from_secs(60)).await;
    issued.push(held.fence());
    assert!(
        lag(&mut on_primary, &mut on_standby).await > 0,
        "the standby replayed grants made after the cut"
    );

    // The primary dies; the standby is promoted.
    primary.kill_now().unwrap();
    promote(&mut on_standby).await;

    let new = PostgresBackend::connect(&standby.url()).await.unwrap();
    let lease = acquired(&new, &name, Duration::from_secs(60)).await;
    let last = *issued.iter().max().unwrap();
    assert!(
        lease.fence() > last,
        "after the failover the name was granted with fence {}, not above the {last} the old \
         primary handed out before it died (fences after the cut: {issued:?})",
        lease.fence()
    );
    // A second grant goes on from there.
    new.release(&lease).await.unwrap();
    let again = acquired(&new, &name, Duration::from_secs(60)).await;
    assert!(again.fence() > lease.fence());
    new.release(&again).await.unwrap();
    drop(held);
}

/// A lease held through a connection that fails over: the client's next
/// connection lands on the promoted standby, sees the new timeline, and
/// every lease it held before is lost at once (its loss signal fires),
/// even one whose row was replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_hear_of_a_failover_at_once() {
    let primary = postgres::start(Options::default()).expect("a primary");
    let relay = FaultProxy::start(primary.addr()).await.unwrap();
    let standby = postgres::start_standby(relay.addr(), Options::default()).expect("a standby");
    // The client reaches "the primary" through an address that moves (a
    // virtual IP, a proxy): here a relay re-pointed at the standby.
    let front = FaultProxy::start(primary.addr()).await.unwrap();
    let client = PostgresBackend::connect(&primary.url_via(front.addr()))
        .await
        .unwrap();
    let name = lock_name("hears");
    let lease = acquired(&client, &name, Duration::from_secs(60)).await;
    let mut on_primary = PgConnection::connect(&primary.url()).await.unwrap();
    let mut on_standby = PgConnection::connect(&standby.url()).await.unwrap();
    caught_up(&mut on_primary, &mut on_standby).await;

    primary.kill_now().unwrap();
    promote(&mut on_standby).await;
    front.repoint(standby.addr());
    // The lock row was replicated: a renewal alone would be answered. The
    // first operation on the new primary must still end the old leases.
    // The first operations fail with the connections the move reset
    // (retryable); the next ones reach the new primary.
    let other = lock_name("after");
    let next = eventually(
        scaled(Duration::from_secs(10)),
        "a grant on the new primary",
        || {
            let (client, other) = (&client, &other);
            async move {
                match client.try_acquire_for(other, Duration::from_secs(60)).await {
                    Ok(attempt) => attempt.into_lease(),
                    Err(e) if e.is_retryable() => None,
                    Err(e) => panic!("acquire on the new primary: {e}"),
                }
            }
        },
    )
    .await;
    let lost = lease
        .loss_signal()
        .expect("a PostgreSQL lease has a loss signal");
    // The grant above ran on a new connection, whose check saw the new
    // timeline before its first statement: the old lease is lost already.
    assert!(
        lost.is_cancelled(),
        "the lease held before the failover is not lost once the client reached the new primary"
    );
    let fresh = next
        .loss_signal()
        .expect("a PostgreSQL lease has a loss signal");
    assert!(
        !fresh.is_cancelled(),
        "a lease of the new primary is not lost"
    );
    client.release(&next).await.unwrap();
}

/// With `failover_lock_delay`, no grant on the promoted server until the
/// delay has passed since a client first saw the failover: the leases of
/// the old primary have run out by then. Every client waits, also one that
/// did not configure the delay (the store recorded when grants resume).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_holds_grants_after_a_failover() {
    let delay = scaled(Duration::from_secs(3));
    let primary = postgres::start(Options::default()).expect("a primary");
    let relay = FaultProxy::start(primary.addr()).await.unwrap();
    let standby = postgres::start_standby(relay.addr(), Options::default()).expect("a standby");
    let with_delay = |url: String| {
        PostgresConfig::from_url(&url)
            .unwrap()
            .failover_lock_delay(delay)
    };
    let old = PostgresBackend::connect_with(with_delay(primary.url()))
        .await
        .unwrap();
    assert_eq!(old.capabilities().failover, Failover::LockDelay(delay));
    let name = lock_name("delay");
    let earlier = acquired(&old, &name, Duration::from_secs(60)).await;
    old.release(&earlier).await.unwrap();
    let mut on_primary = PgConnection::connect(&primary.url()).await.unwrap();
    let mut on_standby = PgConnection::connect(&standby.url()).await.unwrap();
    caught_up(&mut on_primary, &mut on_standby).await;
    relay.set(Mode::Blackhole);
    // A grant the standby never sees: the name is free there.
    let lost_grant = acquired(&old, &name, Duration::from_secs(60)).await;

    primary.kill_now().unwrap();
    promote(&mut on_standby).await;
    let seen = tokio::time::Instant::now();
    let first = PostgresBackend::connect_with(with_delay(standby.url()))
        .await
        .unwrap();
    let plain = PostgresBackend::connect(&standby.url()).await.unwrap();
    for (who, client) in [
        ("the client that saw it", &first),
        ("another client", &plain),
    ] {
        let attempt = client
            .try_acquire_for(&name, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(
            attempt.into_lease().is_none(),
            "{who} was granted the name during the lock delay"
        );
    }
    let wait = WaitPolicy::new(tokio::time::Instant::now() + delay * 4);
    let lease = plain
        .acquire_for(&name, Duration::from_secs(60), &wait)
        .await
        .unwrap()
        .expect("granted once the lock delay is over");
    assert!(
        seen.elapsed() >= delay,
        "granted {:?} after the failover was seen, within the {delay:?} lock delay",
        seen.elapsed()
    );
    assert!(lease.fence() > lost_grant.fence());
    plain.release(&lease).await.unwrap();
}

/// With a synchronous standby, a grant the client saw survives the
/// failover: the promoted server still has the holder, and nobody else is
/// granted the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_keeps_every_grant() {
    let primary =
        postgres::start(Options::default().setting("synchronous_standby_names", "standby"))
            .expect("a primary");
    let standby = postgres::start_standby(primary.addr(), Options::default()).expect("a standby");
    let mut on_primary = PgConnection::connect(&primary.url()).await.unwrap();
    let deadline = tokio::time::Instant::now() + scaled(Duration::from_secs(30));
    loop {
        let sync: Option<String> = sqlx::query_scalar(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'",
        )
        .fetch_optional(&mut on_primary)
        .await
        .unwrap();
        if sync.as_deref() == Some("sync") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby is not synchronous: {sync:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = PostgresBackend::connect(&primary.url()).await.unwrap();
    assert_eq!(old.capabilities().failover, Failover::Synchronous);
    let name = lock_name("sync");
    let held = acquired(&old, &name, Duration::from_secs(60)).await;

    primary.kill_now().unwrap();
    let mut on_standby = PgConnection::connect(&standby.url()).await.unwrap();
    promote(&mut on_standby).await;
    let new = PostgresBackend::connect(&standby.url()).await.unwrap();
    let attempt = new
        .try_acquire_for(&name, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        attempt.into_lease().is_none(),
        "a grant made with a synchronous standby was lost in the failover"
    );
    let holder = new
        .inspect(&name)
        .await
        .unwrap()
        .expect("the holder survived");
    assert_eq!(holder.fence, held.fence());
}

/// A primary, its standby behind a relay that cuts replication, and the
/// front address clients use, for repeated failovers: each promotes the
/// standby and starts a new one of it.
struct Rotation {
    primary: Store,
    standby: Store,
    relay: FaultProxy,
    front: FaultProxy,
    options: Options,
}

impl Rotation {
    async fn start(options: Options) -> Rotation {
        let opts = options.clone();
        let primary = tokio::task::spawn_blocking(move || postgres::start(opts))
            .await
            .unwrap()
            .expect("a primary");
        let relay = FaultProxy::start(primary.addr()).await.unwrap();
        let standby = Self::standby_of(&relay, &options).await;
        let front = FaultProxy::start(primary.addr()).await.unwrap();
        let rotation = Rotation {
            primary,
            standby,
            relay,
            front,
            options,
        };
        rotation.caught_up().await;
        rotation
    }

    async fn standby_of(relay: &FaultProxy, options: &Options) -> Store {
        let (upstream, options) = (relay.addr(), options.clone());
        tokio::task::spawn_blocking(move || postgres::start_standby(upstream, options))
            .await
            .unwrap()
            .expect("a standby")
    }

    async fn caught_up(&self) {
        let mut on_primary = PgConnection::connect(&self.primary.url()).await.unwrap();
        let mut on_standby = PgConnection::connect(&self.standby.url()).await.unwrap();
        caught_up(&mut on_primary, &mut on_standby).await;
    }

    /// Replication cut `lag` before the primary's `kill -9` (what it wrote
    /// meanwhile is lost), the standby promoted, the front address moved
    /// to it, and a new standby of it behind a new relay.
    async fn rotate(&mut self, lag: Duration) {
        self.relay.set(Mode::Blackhole);
        tokio::time::sleep(lag).await;
        self.primary.kill_now().unwrap();
        let mut on_standby = PgConnection::connect(&self.standby.url()).await.unwrap();
        promote(&mut on_standby).await;
        self.front.repoint(self.standby.addr());
        let relay = FaultProxy::start(self.standby.addr()).await.unwrap();
        let standby = Self::standby_of(&relay, &self.options).await;
        self.primary = std::mem::replace(&mut self.standby, standby);
        self.relay = relay;
        self.caught_up().await;
    }
}

/// The failover nemesis: four clients run the random workload through the
/// front address while the primary is killed and the standby promoted,
/// three times (`LOCK_TEST_FAILOVERS`; more in `scripts/soak-failover.sh`),
/// each time losing what it wrote in its last half TTL.
async fn failovers(
    topology: &'static str,
    expect: Expect,
    options: Options,
    configure: fn(PostgresConfig) -> PostgresConfig,
) {
    let ttl = scaled(Duration::from_secs(1));
    let rotation = Rotation::start(options).await;
    let url = rotation.primary.url_via(rotation.front.addr());
    let mut clients: Vec<Arc<dyn LockBackend>> = Vec::new();
    for _ in 0..4 {
        let config = configure(PostgresConfig::from_url(&url).unwrap());
        clients.push(Arc::new(
            PostgresBackend::connect_with(config).await.unwrap(),
        ));
    }
    let run = FailoverRun {
        topology,
        expect,
        ttl,
        // Reconnecting through the moved address, a commit waiting for a
        // synchronous standby, a lock delay.
        call_limit: scaled(Duration::from_secs(4)),
        failovers: lock_conformance::kit::env::FAILOVERS.count(3),
        // More than the lock delay plus a TTL: grants resume between failovers.
        every: ttl * 3,
        seed: rand_seed(),
    };
    let rotation = Arc::new(tokio::sync::Mutex::new(rotation));
    let grants = run_with_failovers(clients, run, |_| {
        let rotation = rotation.clone();
        async move { rotation.lock().await.rotate(ttl / 2).await }
    })
    .await
    .unwrap_or_else(|f| panic!("{f}"));
    assert!(grants > 0);
}

/// A seed for one nemesis run.
fn rand_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

/// With a synchronous standby, no grant is lost in any failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failovers_with_a_synchronous_standby_never_overlap() {
    let sync = Options::default().setting("synchronous_standby_names", "standby");
    failovers("synchronous", Expect::NoOverlap, sync, |c| c).await;
}

/// With a lock delay longer than the TTL, no overlap either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failovers_with_a_lock_delay_never_overlap() {
    failovers("lock_delay", Expect::NoOverlap, Options::default(), |c| {
        c.failover_lock_delay(scaled(Duration::from_millis(1500)))
    })
    .await;
}

/// Without either, fences still grow across every failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failovers_keep_fences_growing() {
    failovers(
        "asynchronous",
        Expect::FencesOnly,
        Options::default(),
        |c| c,
    )
    .await;
}
