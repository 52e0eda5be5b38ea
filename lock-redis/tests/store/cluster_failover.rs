//! Failover inside a Redis Cluster (feature `cluster`): the primary serving
//! a lock's slot is killed (`kill -9`) and its replica promoted, in private
//! Clusters of three primaries with one replica each. A lock the replica
//! had is kept and renewed there; one it lacked (replication cut before the
//! grant) is heard of by its holder at its next renewal, and with
//! `failover_lock_delay` nobody is granted the name before that lease has
//! run out. With `wait_replicas`, a grant waits for its own primary's
//! replica. Fences keep growing throughout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::stores::redis_cluster::{self, RedisCluster};
use lock_conformance::kit::{eventually, until};
use lock_redis::{RedisBackend, RedisConfig, redis};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, Failover, LockBackend, LockError, LockName};
use tokio::time::Instant;

use super::cluster::{cli, owner, owner_seen_by};
use super::support::{granted_after_the_lock_delay, raw, scaled, take, unique};

/// The TTL of the leases a failover may lose.
const TTL: Duration = Duration::from_secs(3);

/// A private Cluster of three primaries with one replica each.
async fn replicated_cluster() -> Arc<RedisCluster> {
    let cluster = tokio::task::spawn_blocking(|| redis_cluster::start_with_replicas(1))
        .await
        .expect("launcher thread")
        .expect("a Redis Cluster with replicas");
    Arc::new(cluster)
}

/// A client of `cluster`, configured by `configure`.
async fn client(
    cluster: &RedisCluster,
    configure: impl FnOnce(RedisConfig) -> RedisConfig,
) -> RedisBackend {
    let config = RedisConfig::from_url(&cluster.url()).unwrap();
    RedisBackend::connect_with(configure(config)).await.unwrap()
}

/// Where a name's keys live: its lock key, its slot, and the nodes (by
/// index) of the primary serving the slot and of that primary's replica.
struct Placement {
    lock_key: String,
    slot: u16,
    primary: usize,
    replica: usize,
}

async fn placement(cluster: &Arc<RedisCluster>, name: &LockName) -> Placement {
    let lock_key = format!("distlock:{{{name}}}");
    let slot: u16 = cli(cluster, 0, &["cluster", "keyslot", &lock_key])
        .await
        .trim()
        .parse()
        .unwrap();
    let primary = owner(cluster, slot).await;
    let primary_id = cli(cluster, primary, &["cluster", "myid"])
        .await
        .trim()
        .to_owned();
    // Its replica: the node whose CLUSTER NODES line names it as master
    // (once the primary has heard of it: a new Cluster's gossip may lag).
    let replica_port: u16 = eventually(
        scaled(Duration::from_secs(10)),
        "the primary knows its replica",
        || {
            let (cluster, primary_id) = (cluster.clone(), primary_id.clone());
            async move {
                let nodes = cli(&cluster, primary, &["cluster", "nodes"]).await;
                nodes
                    .lines()
                    .find(|l| l.split(' ').nth(3) == Some(primary_id.as_str()))
                    .and_then(|l| l.split(' ').nth(1))
                    .and_then(|a| a.split('@').next())
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| p.parse().ok())
            }
        },
    )
    .await;
    let replica = cluster
        .nodes
        .iter()
        .position(|n| n.addr().port() == replica_port)
        .unwrap();
    Placement {
        lock_key,
        slot,
        primary,
        replica,
    }
}

/// One field of node `node`'s `INFO replication`.
async fn replication(cluster: &Arc<RedisCluster>, node: usize, field: &str) -> String {
    let info = cli(cluster, node, &["info", "replication"]).await;
    info.lines()
        .find_map(|line| line.trim().strip_prefix(&format!("{field}:")))
        .unwrap_or_default()
        .to_owned()
}

/// Waits until the replica has replayed everything its primary wrote.
async fn caught_up(cluster: &Arc<RedisCluster>, at: &Placement) {
    let (primary, replica) = (at.primary, at.replica);
    until(
        scaled(Duration::from_secs(30)),
        "the replica caught up with its primary",
        || {
            let cluster = cluster.clone();
            async move {
                let written = replication(&cluster, primary, "master_repl_offset").await;
                let link = replication(&cluster, replica, "master_link_status").await;
                let replayed = replication(&cluster, replica, "slave_repl_offset").await;
                link == "up"
                    && replayed.parse::<u64>().unwrap_or(0)
                        >= written.parse::<u64>().unwrap_or(u64::MAX)
            }
        },
    )
    .await;
}

/// Waits until the Cluster serves the slot from the replica.
async fn promoted(cluster: &Arc<RedisCluster>, at: &Placement) {
    let (slot, replica) = (at.slot, at.replica);
    until(
        scaled(Duration::from_secs(30)),
        "the replica is promoted",
        || {
            let cluster = cluster.clone();
            async move { owner_seen_by(&cluster, slot, replica).await == replica }
        },
    )
    .await;
}

/// Runs `unreplicated` with replication to the replica cut, then kills the
/// primary and waits for the replica's promotion: nothing `unreplicated`
/// wrote survives. The replica is stopped while its primary closes their
/// link, so it cannot reconnect before the primary dies; it is stopped for
/// a few round trips, well within the Cluster's 1 s node timeout.
async fn lost_in_a_failover<T>(
    cluster: &Arc<RedisCluster>,
    at: &Placement,
    unreplicated: impl Future<Output = T>,
) -> T {
    cluster.nodes[at.replica].pause_now().unwrap();
    cli(cluster, at.primary, &["client", "kill", "type", "replica"]).await;
    let out = unreplicated.await;
    cluster.nodes[at.primary].kill_now().unwrap();
    cluster.nodes[at.replica].resume_now().unwrap();
    promoted(cluster, at).await;
    out
}

/// A grant the promoted replica never had: its holder hears at its next
/// renewal (the key is gone), and with `failover_lock_delay` the slot
/// grants nothing until the delay has passed since the first grant the
/// promoted replica answered (it finds another replication id than the
/// slot's record; the first client to see it sets the delay), so the lost
/// lease has run out before anyone else is granted the name. A client
/// without the delay waits too: the store recorded it. The next fence is
/// above the lost one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_delay_outlasts_a_lease_a_failover_inside_the_cluster_lost() {
    let cluster = replicated_cluster().await;
    let delay = scaled(TTL + Duration::from_secs(1));
    let holder = client(&cluster, |c| c.failover_lock_delay(delay)).await;
    assert_eq!(holder.capabilities().failover, Failover::LockDelay(delay));
    let name = unique("cluster-delay");
    let at = placement(&cluster, &name).await;
    // An earlier grant records the slot's replication id, and the replica
    // gets the record.
    let earlier = take(&holder, &name, TTL).await;
    holder.release(&earlier).await.unwrap();
    caught_up(&cluster, &at).await;
    let held = lost_in_a_failover(&cluster, &at, take(&holder, &name, TTL)).await;

    let heard = eventually(
        scaled(Duration::from_secs(20)),
        "the holder's renewal answered by the promoted replica",
        || {
            let (holder, held) = (holder.clone(), held.clone());
            async move {
                match holder.renew(&held).await {
                    Err(LockError::NotHeld { .. }) => Some(()),
                    Ok(_) => panic!("the promoted replica renewed a lease it never had"),
                    Err(e) if e.is_retryable() => None,
                    Err(e) => panic!("renew: {e}"),
                }
            }
        },
    );
    heard.await;
    let first = client(&cluster, |c| c.failover_lock_delay(delay)).await;
    let seen = eventually(
        scaled(Duration::from_secs(20)),
        "a grant answered by the promoted replica",
        || {
            let (first, name) = (first.clone(), name.clone());
            async move {
                let sent = Instant::now();
                match first.try_acquire_for(&name, TTL).await {
                    Ok(Attempt::Held { .. }) => Some(sent),
                    Ok(Attempt::Acquired(_)) => {
                        panic!("the promoted replica granted the name during the lock delay")
                    }
                    Err(e) if e.is_retryable() => None,
                    Err(e) => panic!("acquire: {e}"),
                }
            }
        },
    )
    .await;
    let plain = client(&cluster, |c| c).await;
    granted_after_the_lock_delay(&plain, &name, (delay, seen), &held).await;
}

/// With `wait_replicas`, a grant is handed out only once the replica of
/// the primary that granted it has it: with that replica stopped the grant
/// is refused (the other primaries' replicas, which would answer a `WAIT`
/// sent to the wrong node at once, do not count) and given back, so the
/// name is free again as soon as the replica answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_replicas_a_grant_waits_for_its_own_primarys_replica() {
    let cluster = replicated_cluster().await;
    let client = client(&cluster, |c| c.wait_replicas(1)).await;
    assert_eq!(client.capabilities().failover, Failover::Synchronous);
    let name = unique("cluster-wait");
    let at = placement(&cluster, &name).await;
    caught_up(&cluster, &at).await;
    let first = take(&client, &name, TTL).await;
    client.release(&first).await.unwrap();

    cluster.nodes[at.replica].pause_now().unwrap();
    let refused = client.try_acquire_for(&name, TTL).await;
    cluster.nodes[at.replica].resume_now().unwrap();
    let error = refused.expect_err("granted while its primary's replica was stopped");
    assert!(
        error.to_string().contains("0 of the 1 replicas"),
        "not the replicas' refusal: {error}"
    );
    // The replica answers again once it has replayed what it missed.
    let again = eventually(
        scaled(Duration::from_secs(10)),
        "a grant its replica acknowledges",
        || {
            let (client, name) = (client.clone(), name.clone());
            async move {
                match client.try_acquire_for(&name, TTL).await {
                    Ok(Attempt::Acquired(lease)) => Some(lease),
                    Ok(Attempt::Held { .. }) => panic!("the refused grant was not given back"),
                    Err(e) if e.is_retryable() => None,
                    Err(e) => panic!("acquire: {e}"),
                }
            }
        },
    )
    .await;
    assert!(again.fence() > first.fence(), "fences keep growing");
    client.release(&again).await.unwrap();
}

/// The primary serving a held lock's slot is killed and its replica
/// promoted after it had the grant. The client follows the new layout: the
/// lock is still held and renewed on the promoted replica, a contender is
/// refused, and the next grant's fence is above the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_failover_inside_the_cluster_keeps_replicated_locks() {
    let cluster = replicated_cluster().await;
    let url = cluster.url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let contender = RedisBackend::connect(&url).await.unwrap();
    let name = unique("failover");
    let at = placement(&cluster, &name).await;
    let ttl = scaled(Duration::from_secs(30));
    let lease = take(&holder, &name, ttl).await;
    // The replica has the grant before the primary dies.
    let replica_con = raw(&cluster.nodes[at.replica].url()).await;
    until(
        scaled(Duration::from_secs(10)),
        "the replica has the lock key",
        || {
            let mut con = replica_con.clone();
            let lock_key = at.lock_key.clone();
            async move {
                let held: redis::RedisResult<(Option<String>,)> = redis::pipe()
                    .cmd("READONLY")
                    .ignore()
                    .cmd("GET")
                    .arg(&lock_key)
                    .query_async(&mut con)
                    .await;
                matches!(held, Ok((Some(_),)))
            }
        },
    )
    .await;
    cluster.nodes[at.primary].kill_now().unwrap();
    promoted(&cluster, &at).await;
    // Renewals reach the promoted replica once the client relearns the
    // layout (requests in between fail retryably).
    let renewed = eventually(
        scaled(Duration::from_secs(20)),
        "the holder renews on the promoted replica",
        || {
            let (holder, lease) = (holder.clone(), lease.clone());
            async move {
                match holder.renew(&lease).await {
                    Ok(renewed) => Some(renewed),
                    Err(LockError::NotHeld { .. }) => panic!("the replicated lock was lost"),
                    Err(_) => None,
                }
            }
        },
    )
    .await;
    match contender.try_acquire_for(&name, ttl).await.unwrap() {
        Attempt::Held { .. } => {}
        Attempt::Acquired(_) => panic!("granted twice across the failover"),
    }
    holder.release(&renewed).await.unwrap();
    let next = take(&contender, &name, ttl).await;
    assert!(next.fence() > lease.fence(), "fences keep growing");
}
