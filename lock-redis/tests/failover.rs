//! Failover to a replica: Redis replicates asynchronously, so a promoted
//! replica can lack the lock key of a grant made just before the primary
//! died, and grant the name again while its holder still works. Fences must
//! still grow, every holder must hear, and with `failover_lock_delay` no
//! grant may come before the old primary's leases have run out.
//!
//! A test binary of its own: each test runs a primary, a replica fed
//! through a relay that cuts replication, and a front address (a proxy
//! re-pointed at the promoted replica, as a VIP or HAProxy would be) that
//! clients connect to.

#[path = "store/support.rs"]
mod support;

use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_redis::redis;
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::backend::{LockBackendExt, LockRequest};
use std::sync::Arc;

use lock_conformance::cases::failover::{Expect, FailoverRun, run_with_failovers};
use lockcore::{Failover, Lease, LockBackend, LockName};
use support::{granted_after_the_lock_delay, raw, scaled, take, unique};
use tokio::time::Instant;

/// The TTL of the lease the failover loses.
const TTL: Duration = Duration::from_secs(3);

/// The TTL of the failover nemesis's grants (scaled).
const NEMESIS_TTL: Duration = Duration::from_secs(1);

/// A primary, its replica behind a relay, and the front address clients use.
struct Topology {
    primary: Store,
    replica: Store,
    relay: FaultProxy,
    front: FaultProxy,
}

impl Topology {
    async fn start() -> Topology {
        // Its replica gets its first copy at once (no diskless-sync delay).
        let primary =
            support::private(Options::durable().server_args(["--repl-diskless-sync-delay", "0"]))
                .await;
        let relay = FaultProxy::start(primary.addr()).await.unwrap();
        let replica = replica_of(&relay).await;
        let front = FaultProxy::start(primary.addr()).await.unwrap();
        Topology {
            primary,
            replica,
            relay,
            front,
        }
    }

    /// A client of the front address, configured by `configure`.
    async fn client(&self, configure: impl FnOnce(RedisConfig) -> RedisConfig) -> RedisBackend {
        let config = RedisConfig::from_url(&self.primary.url_via(self.front.addr())).unwrap();
        RedisBackend::connect_with(configure(config)).await.unwrap()
    }

    /// Waits until the replica has everything the primary wrote.
    async fn caught_up(&self) {
        let (primary, replica) = (
            raw(&self.primary.url()).await,
            raw(&self.replica.url()).await,
        );
        until(
            scaled(Duration::from_secs(30)),
            "the replica caught up with the primary",
            || {
                let (mut primary, mut replica) = (primary.clone(), replica.clone());
                async move {
                    let written = info_field(&mut primary, "master_repl_offset").await;
                    let link = info_field(&mut replica, "master_link_status").await;
                    let replayed = info_field(&mut replica, "slave_repl_offset").await;
                    link == "up"
                        && replayed.parse::<u64>().unwrap_or(0)
                            >= written.parse::<u64>().unwrap_or(u64::MAX)
                }
            },
        )
        .await;
    }

    /// A grant of `name` by `holder` that the replica never sees: the
    /// name's counter and its slot's era reach it (an earlier grant, then
    /// the replica catches up), then replication is cut.
    async fn unreplicated_grant(&self, holder: &RedisBackend, name: &LockName) -> Lease {
        let earlier = take(holder, name, TTL).await;
        holder.release(&earlier).await.unwrap();
        self.caught_up().await;
        self.cut();
        take(holder, name, TTL).await
    }

    /// Cuts replication: nothing the primary writes from now on reaches
    /// the replica.
    fn cut(&self) {
        self.relay.set(Mode::Blackhole);
    }

    /// A failover that loses what the primary wrote in its last `lag`
    /// (replication cut that long before the kill), and a new replica for
    /// the next one: the promoted replica is the primary from now on, and a
    /// fresh replica (behind a fresh relay) follows it.
    async fn rotate(&mut self, lag: Duration) {
        self.cut();
        tokio::time::sleep(lag).await;
        self.fail_over().await;
        let relay = FaultProxy::start(self.replica.addr()).await.unwrap();
        let replica = replica_of(&relay).await;
        self.primary = std::mem::replace(&mut self.replica, replica);
        self.relay = relay;
        self.caught_up().await;
    }

    /// `kill -9` of the primary, `REPLICAOF NO ONE` on the replica, and the
    /// front address moved to it.
    async fn fail_over(&self) {
        self.primary.kill_now().unwrap();
        let mut replica = raw(&self.replica.url()).await;
        let () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut replica)
            .await
            .unwrap();
        self.front.repoint(self.replica.addr());
    }
}

/// A durable replica of the server behind `relay`.
async fn replica_of(relay: &FaultProxy) -> Store {
    let upstream = relay.addr();
    tokio::task::spawn_blocking(move || launcher::start_replica(upstream, Options::durable()))
        .await
        .unwrap()
        .expect("a replica")
}

/// One field of `INFO replication`.
async fn info_field(con: &mut redis::aio::MultiplexedConnection, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.trim().strip_prefix(&format!("{field}:")))
        .unwrap_or_default()
        .to_owned()
}

/// A grant on `client` once it reaches the new primary: the first attempts
/// may fail on connections the move reset (retryable).
async fn granted_after_the_move(client: &RedisBackend, name: &LockName) -> Lease {
    eventually(
        scaled(Duration::from_secs(10)),
        "a grant on the promoted replica",
        || async move {
            match client.try_acquire_for(name, TTL).await {
                Ok(attempt) => attempt.into_lease(),
                Err(e) if e.is_retryable() => None,
                Err(e) => panic!("acquire on the promoted replica: {e}"),
            }
        },
    )
    .await
}

/// The reproduction: a grant the replica never saw is lost in the
/// failover, and another client is granted the name at once (Redis has no
/// other answer). Its fence is still larger (the server clock floors it),
/// and the holder's client hears without renewing: its subscription moves
/// with the front address, and the first look at the new server finds
/// another replication id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_grow_and_holders_hear_after_an_async_failover() {
    let topology = Topology::start().await;
    let holder = topology.client(|c| c).await;
    assert_eq!(holder.capabilities().failover, Failover::Asynchronous);
    let name = unique("failover");
    let held = topology.unreplicated_grant(&holder, &name).await;

    topology.fail_over().await;
    let other = topology.client(|c| c).await;
    let lease = granted_after_the_move(&other, &name).await;
    assert!(
        lease.fence() > held.fence(),
        "after the failover the name was granted with fence {}, not above the {} the old \
         primary handed out",
        lease.fence(),
        held.fence()
    );
    let lost = held.loss_signal().expect("a Redis lease has a loss signal");
    // The subscription reconnects with backoff (at most a second) and then
    // asks the new server, within the response timeout.
    let within = scaled(Duration::from_secs(2) + RedisConfig::DEFAULT_RESPONSE_TIMEOUT * 2);
    tokio::time::timeout(within, lost.cancelled())
        .await
        .unwrap_or_else(|_| panic!("the holder did not hear of the failover within {within:?}"));
    other.release(&lease).await.unwrap();
}

/// The client's own next grant on the promoted server ends every lease it
/// held before, even one whose key was replicated (it cannot tell which
/// were): the loss signal has fired when the grant returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_on_the_promoted_replica_ends_the_clients_earlier_leases() {
    let topology = Topology::start().await;
    let client = topology.client(|c| c).await;
    let kept = take(&client, &unique("kept"), TTL).await;
    let permits = LockRequest::new(
        unique("permits"),
        client.capabilities().effective_ttl(TTL).unwrap(),
    );
    let permit = client
        .try_acquire_permit(&permits, 2)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    topology.caught_up().await;

    topology.fail_over().await;
    let next = granted_after_the_move(&client, &unique("next")).await;
    for (what, lease) in [("lock", &kept), ("permit", &permit)] {
        assert!(
            lease.loss_signal().unwrap().is_cancelled(),
            "the {what} lease held before the failover is not lost once the client was \
             granted on the promoted replica"
        );
    }
    assert!(
        !next.loss_signal().unwrap().is_cancelled(),
        "a lease of the new primary is not lost"
    );
    client.release(&next).await.unwrap();
}

/// A holder whose grant was replicated (its key is on the promoted replica,
/// alive for long after the failover) hears of the failover without
/// granting anything: its subscription moves with the front address, and
/// the first look at the new server finds another replication id. The key
/// says nothing: only the id tells. With and without a lock delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_of_a_replicated_grant_hears_of_the_failover_without_granting() {
    let long = Duration::from_secs(60);
    for delay in [None, Some(scaled(TTL))] {
        let topology = Topology::start().await;
        let holder = topology
            .client(|c| match delay {
                Some(d) => c.failover_lock_delay(d),
                None => c,
            })
            .await;
        let held = take(&holder, &unique("replicated"), long).await;
        topology.caught_up().await;

        topology.fail_over().await;
        let lost = held.loss_signal().expect("a Redis lease has a loss signal");
        // As in the unreplicated case: reconnect with backoff (at most a
        // second), then one request to the new server.
        let within = scaled(Duration::from_secs(2) + RedisConfig::DEFAULT_RESPONSE_TIMEOUT * 2);
        tokio::time::timeout(within, lost.cancelled())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "lock delay {delay:?}: the holder of a replicated grant did not hear of the \
                     failover within {within:?}"
                )
            });
    }
}

/// With `failover_lock_delay`, the promoted replica grants nothing until
/// the delay has passed since a grant first saw the failover, so the lost
/// grant's holder has stopped before anyone else starts: no overlap. A
/// client without the delay waits too (the store recorded it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_outlasts_the_leases_the_failover_lost() {
    let delay = scaled(TTL + Duration::from_secs(1));
    let topology = Topology::start().await;
    let holder = topology.client(|c| c.failover_lock_delay(delay)).await;
    assert_eq!(holder.capabilities().failover, Failover::LockDelay(delay));
    let name = unique("delay");
    let held = topology.unreplicated_grant(&holder, &name).await;

    topology.fail_over().await;
    let first = topology.client(|c| c.failover_lock_delay(delay)).await;
    let plain = topology.client(|c| c).await;
    let seen = Instant::now();
    for (who, client) in [("a client with the delay", &first), ("one without", &plain)] {
        let attempt = client.try_acquire_for(&name, TTL).await.unwrap();
        assert!(
            attempt.into_lease().is_none(),
            "{who} was granted the name during the lock delay"
        );
    }
    granted_after_the_lock_delay(&plain, &name, (delay, seen), &held).await;
}

/// With `wait_replicas`, a grant is handed out only once the replica has
/// it: a failover right after it keeps the holder, and nobody else is
/// granted the name. Replication runs 100 ms late each way, and what is
/// still in flight when the primary dies is dropped: without the `WAIT`,
/// the replica would never see the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_every_grant_survives_a_failover() {
    let topology = Topology::start().await;
    topology.caught_up().await;
    let late = Duration::from_millis(100);
    topology.relay.set(Mode::Delay {
        base: late,
        jitter: Duration::ZERO,
    });
    // A WAIT may take half the response timeout: room for the lag.
    let patient = scaled(RedisConfig::DEFAULT_RESPONSE_TIMEOUT * 4);
    let client = topology
        .client(|c| c.wait_replicas(1).response_timeout(patient))
        .await;
    assert_eq!(client.capabilities().failover, Failover::Synchronous);
    let name = unique("lossless");
    let held = take(&client, &name, support::LONG).await;
    let permits = LockRequest::new(
        unique("lossless-permits"),
        client.capabilities().effective_ttl(support::LONG).unwrap(),
    );
    let permit = client
        .try_acquire_permit(&permits, 1)
        .await
        .unwrap()
        .into_lease()
        .expect("a free permit");
    topology.cut();

    topology.fail_over().await;
    let other = topology.client(|c| c).await;
    let holder = eventually(
        scaled(Duration::from_secs(10)),
        "an answer from the promoted replica",
        || async {
            match other.inspect(&name).await {
                Ok(holder) => Some(holder),
                Err(e) if e.is_retryable() => None,
                Err(e) => panic!("inspect on the promoted replica: {e}"),
            }
        },
    )
    .await;
    assert_eq!(
        holder.map(|h| h.fence),
        Some(held.fence()),
        "a grant made with wait_replicas was lost in the failover"
    );
    let attempt = other.try_acquire_for(&name, TTL).await.unwrap();
    assert!(attempt.into_lease().is_none(), "granted twice");
    let slots = other.inspect_permits(permits.name()).await.unwrap();
    assert_eq!(slots.len(), 1, "the permit was lost in the failover");
    assert_eq!(slots[0].fence, permit.fence());
}

/// With `wait_replicas`, what the replicas did not acknowledge is not
/// handed out: with replication cut, an acquire fails (retryable, naming
/// the option) and leaves no holder, and a renewal is not adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_nothing_unreplicated_is_handed_out() {
    let topology = Topology::start().await;
    topology.caught_up().await;
    // A WAIT may take half the response timeout: room for a loaded machine
    // before the cut (the default's 500 ms was once not enough in CI).
    let patient = scaled(RedisConfig::DEFAULT_RESPONSE_TIMEOUT * 4);
    let client = topology
        .client(|c| c.wait_replicas(1).response_timeout(patient))
        .await;
    let held = take(&client, &unique("before-the-cut"), support::LONG).await;
    topology.cut();

    let name = unique("unreplicated");
    let err = client.try_acquire_for(&name, TTL).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("wait_replicas"), "{err}");
    assert_eq!(
        client.inspect(&name).await.unwrap(),
        None,
        "the unacknowledged grant was left held"
    );
    let renewed = client.renew(&held).await;
    assert!(
        renewed.is_err(),
        "a renewal the replica lacks was adopted: {renewed:?}"
    );
}

/// The failover nemesis: four clients run the random workload through the
/// front address while the primary is killed and a replica promoted, three
/// times (`LOCK_TEST_FAILOVERS`; more in `scripts/soak-failover.sh`), each
/// time losing what it wrote in its last half TTL (replication cut).
async fn failovers(
    topology_name: &'static str,
    expect: Expect,
    configure: fn(RedisConfig) -> RedisConfig,
) {
    let topology = Topology::start().await;
    topology.caught_up().await;
    let mut clients: Vec<Arc<dyn LockBackend>> = Vec::new();
    for _ in 0..4 {
        clients.push(Arc::new(topology.client(configure).await));
    }
    // More than the lock delay plus a TTL: grants resume between failovers.
    nemesis(
        topology,
        clients,
        (topology_name, expect),
        scaled(NEMESIS_TTL) * 3,
    )
    .await;
}

/// A topology the nemesis fails over, losing what the primary wrote in its
/// last `lag`.
trait Rotate: Send + 'static {
    fn rotate(&mut self, lag: Duration) -> impl std::future::Future<Output = ()> + Send;
}

impl Rotate for Topology {
    async fn rotate(&mut self, lag: Duration) {
        Topology::rotate(self, lag).await
    }
}

impl Rotate for SentinelTopology {
    async fn rotate(&mut self, lag: Duration) {
        SentinelTopology::rotate(self, lag).await
    }
}

/// Runs the failover nemesis on `clients` of `topology` (named, and what
/// it promises), failing over every `every`: half a TTL lost each time.
async fn nemesis<T: Rotate>(
    topology: T,
    clients: Vec<Arc<dyn LockBackend>>,
    (name, expect): (&'static str, Expect),
    every: Duration,
) {
    let ttl = scaled(NEMESIS_TTL);
    let run = FailoverRun {
        topology: name,
        expect,
        ttl,
        // A call may reconnect (the connect timeout) and then wait one
        // response, WAIT included (half of it) or a lock delay's answer.
        call_limit: scaled(
            RedisConfig::DEFAULT_CONNECT_TIMEOUT + RedisConfig::DEFAULT_RESPONSE_TIMEOUT * 2,
        ),
        failovers: lock_conformance::kit::env::FAILOVERS.count(3),
        every,
        seed: support::rand_u64(),
    };
    let topology = Arc::new(tokio::sync::Mutex::new(topology));
    let grants = run_with_failovers(clients, run, |_| {
        let topology = topology.clone();
        async move { topology.lock().await.rotate(ttl / 2).await }
    })
    .await
    .unwrap_or_else(|f| panic!("{f}"));
    assert!(grants > 0);
}

/// With `wait_replicas`, no grant is lost in any failover: no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failovers_with_wait_replicas_never_overlap() {
    failovers("wait_replicas", Expect::NoOverlap, |c| c.wait_replicas(1)).await;
}

/// With a lock delay longer than the TTL, no overlap either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failovers_with_a_lock_delay_never_overlap() {
    failovers("lock_delay", Expect::NoOverlap, |c| {
        c.failover_lock_delay(scaled(Duration::from_millis(1500)))
    })
    .await;
}

/// Without either, fences still grow across every failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failovers_keep_fences_growing() {
    failovers("asynchronous", Expect::FencesOnly, |c| c).await;
}

/// A primary, its replica behind a relay, and three sentinels that
/// monitor the primary as `locks` and promote the replica when it dies.
struct SentinelTopology {
    primary: Store,
    replica: Store,
    relay: FaultProxy,
    sentinels: Vec<Store>,
    observer: redis::aio::MultiplexedConnection,
}

impl SentinelTopology {
    async fn start() -> SentinelTopology {
        let primary =
            support::private(Options::durable().server_args(["--repl-diskless-sync-delay", "0"]))
                .await;
        let relay = FaultProxy::start(primary.addr()).await.unwrap();
        let replica = replica_of(&relay).await;
        let addr = primary.addr();
        let sentinels =
            tokio::task::spawn_blocking(move || launcher::start_sentinels(addr, "locks", 3))
                .await
                .unwrap()
                .expect("three sentinels");
        let observer = raw(&sentinels[0].url()).await;
        let topology = SentinelTopology {
            primary,
            replica,
            relay,
            sentinels,
            observer,
        };
        topology.know_replica().await;
        topology
    }

    /// The URL clients connect with.
    fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/locks",
            launcher::sentinel_hosts(&self.sentinels)
        )
    }

    /// Waits until the sentinels list the replica, healthy: they learn it
    /// from the primary.
    async fn know_replica(&self) {
        let port = self.replica.addr().port().to_string();
        until(
            scaled(Duration::from_secs(30)),
            "the sentinels know the replica",
            || {
                let (mut observer, port) = (self.observer.clone(), port.clone());
                async move {
                    let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg("locks")
                        .query_async(&mut observer)
                        .await
                        .unwrap_or_default();
                    replicas.iter().any(|fields| {
                        let field = |name: &str| {
                            fields
                                .chunks(2)
                                .find(|kv| kv[0] == name)
                                .map(|kv| kv[1].clone())
                                .unwrap_or_default()
                        };
                        field("port") == port && !field("flags").contains("down")
                    })
                }
            },
        )
        .await;
    }

    /// Waits until the sentinels name the replica the primary.
    async fn promoted(&self) {
        let port = self.replica.addr().port().to_string();
        // Sentinel's own pace: down after 500 ms, then an election,
        // retried every 2 s (twice its failover timeout) when it fails.
        until(
            scaled(Duration::from_secs(60)),
            "the sentinels promote the replica",
            || {
                let (mut observer, port) = (self.observer.clone(), port.clone());
                async move {
                    let primary: Vec<String> = redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg("locks")
                        .query_async(&mut observer)
                        .await
                        .unwrap_or_default();
                    primary.get(1) == Some(&port)
                }
            },
        )
        .await;
    }

    /// Replication cut `lag` before the primary's `kill -9` (what it wrote
    /// meanwhile is lost), the sentinels' promotion of the replica, and a
    /// new replica of it (behind a new relay) that they know.
    async fn rotate(&mut self, lag: Duration) {
        self.relay.set(Mode::Blackhole);
        tokio::time::sleep(lag).await;
        self.primary.kill_now().unwrap();
        self.promoted().await;
        let relay = FaultProxy::start(self.replica.addr()).await.unwrap();
        let replica = replica_of(&relay).await;
        self.primary = std::mem::replace(&mut self.replica, replica);
        self.relay = relay;
        self.know_replica().await;
    }
}

/// Through Sentinel (`redis+sentinel://`), the client follows a failover
/// the sentinels make: after a `kill -9` of the primary it is granted on
/// the replica they promote, the lease it held before is lost (another
/// replication id), and fences keep growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_follow_a_sentinel_failover() {
    let topology = SentinelTopology::start().await;
    let client = RedisBackend::connect(&topology.url()).await.unwrap();
    let name = unique("sentinel");
    let held = take(&client, &name, support::LONG).await;

    topology.primary.kill_now().unwrap();
    let killed = tokio::time::Instant::now();
    topology.promoted().await;
    let next = granted_after_the_move(&client, &unique("after")).await;
    eprintln!(
        "granted on the promoted replica {:?} after the kill",
        killed.elapsed()
    );
    let mut on_replica = raw(&topology.replica.url()).await;
    assert_eq!(info_field(&mut on_replica, "role").await, "master");
    assert!(
        held.loss_signal().unwrap().is_cancelled(),
        "the lease held before the failover is not lost"
    );
    assert!(next.fence() > held.fence());
    client.release(&next).await.unwrap();
}

/// The failover nemesis through Sentinel: the clients find the primary
/// through the sentinels, which promote the replica after each `kill -9`
/// (asynchronous replication, no lock delay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failovers_through_sentinel_keep_fences_growing() {
    let topology = SentinelTopology::start().await;
    let mut clients: Vec<Arc<dyn LockBackend>> = Vec::new();
    for _ in 0..4 {
        clients.push(Arc::new(
            RedisBackend::connect(&topology.url()).await.unwrap(),
        ));
    }
    // A sentinel failover takes seconds: grants resume in between.
    let every = scaled(Duration::from_secs(8));
    nemesis(topology, clients, ("sentinel", Expect::FencesOnly), every).await;
}

/// The lock delay needs the replication id: an ACL that denies `INFO`
/// makes connect refuse it, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_without_info_is_refused_at_connect() {
    let store = support::private(Options::durable()).await;
    let mut admin = raw(&store.url()).await;
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "locks", "on", ">pw", "~*", "&*", "+@all", "-info",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = store.url().replace("redis://", "redis://locks:pw@");
    let config = RedisConfig::from_url(&url)
        .unwrap()
        .failover_lock_delay(Duration::from_secs(5));
    let err = RedisBackend::connect_with(config).await.unwrap_err();
    assert!(err.to_string().contains("+info"), "{err}");
    // Without the delay it connects, and declares what it cannot see.
    let plain = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(plain.capabilities().failover, Failover::Asynchronous);
    let lease = take(&plain, &unique("no-info"), TTL).await;
    plain.release(&lease).await.unwrap();
}
