//! What `connect` learns from the cluster and checks: the smallest lease
//! TTL it enforces (and so the capabilities), and that the user may read
//! under the key prefix (the fence floor's read).

use std::time::Duration;

use etcd_client::Client;
use lockcore::{Capabilities, ExpiryClock, Fairness, FenceDurability, LockError};

use crate::connection::Conn;
use crate::error::{BACKEND, timed};
use crate::fence::floor::Floor;

/// etcd refuses lease TTLs above this (`MaxLeaseTTL`, 9e9 s).
pub const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

/// How often etcd's leader looks for expired leases (etcd 3.4's lessor
/// loop); it then revokes them through raft.
const EXPIRY_SWEEP: Duration = Duration::from_millis(500);

/// The fixed part of how long after its TTL etcd may keep a lock whose
/// holder died, on a cluster whose minimum lease TTL is `min_ttl`; the
/// capabilities add 100% of the lock's TTL
/// ([`Capabilities::slack_for`](lockcore::Capabilities::slack_for)).
///
/// Without a leader change, one expiry sweep. etcd 3.4 keeps lease
/// deadlines in the leader's memory only: a new leader (after a leader loss
/// or a restart) restarts every lease at its full TTL plus one election
/// timeout. Electing it takes up to two election timeouts (followers wait a
/// random one to two), four with a split vote. A holder that died just
/// before its lease's sweep is then revoked
///
/// ```text
/// TTL + sweep (missed) + 4 × election (new leader) + election + TTL (restarted lease) + sweep
/// ```
///
/// after its last renewal: the slack is one more TTL (the part that grows
/// with the TTL), five election timeouts and two sweeps. etcd's minimum
/// lease TTL is 1.5 election timeouts rounded up to whole seconds, so an
/// election timeout is at most two thirds of it: five of them are at most
/// 10/3 of the minimum TTL. A restart adds its downtime; every further
/// leader change adds as much again. Measured on a 3-member cluster with
/// 500 ms elections and 1 s leases, a dead holder's lock went up to 3.5 s
/// past its TTL when the leader was killed, 60 times at points across the
/// lease (`tests/store/failover.rs`).
fn fixed_expiry_slack(min_ttl: Duration) -> Duration {
    let five_elections = min_ttl * 10 / 3;
    five_elections + EXPIRY_SWEEP * 2
}

/// The part of the expiry slack that grows with the TTL: a leader change
/// restarts a lease at its full TTL.
const SLACK_TTL_PERCENT: u32 = 100;

/// The capabilities on this cluster: etcd raises any TTL below its minimum
/// without saying so, so a 1 s lease is granted and what etcd made of it
/// read back (and revoked).
pub(crate) async fn capabilities(
    client: &Client,
    conn: &Conn,
    timeout: Duration,
) -> Result<Capabilities, LockError> {
    let probe = timed(timeout, "lease grant", client.lease_client().grant(1, None)).await?;
    let min_secs = u64::try_from(probe.ttl()).unwrap_or(0).max(1);
    let min_ttl = Duration::from_secs(min_secs);
    // Gone within a second anyway: revoked in the background, a clean-up.
    let mut leases = client.lease_client();
    conn.cleanup(async move {
        let _ = tokio::time::timeout(timeout, leases.revoke(probe.id())).await;
    });
    Ok(Capabilities::new(BACKEND)
        // A quorum decides every write: a new leader has every grant.
        .failover(lockcore::Failover::Consensus)
        .expiry_clock(ExpiryClock::StoreLeaseTimer)
        .ttl_range(min_ttl, MAX_TTL)
        .ttl_granularity(Duration::from_secs(1))
        .fairness(Fairness::Fifo)
        .fence_durability(FenceDurability::Durable)
        .notifications(true)
        .semaphores(true)
        .rw_locks(true)
        .fence_floor(true)
        // A grant moves onto a lease of its own (`locks::remaining`).
        .sets_remaining(true)
        // Every lock or none in one `Txn` (`locks::multi`).
        .atomic_multi(true)
        // A fence is an int64 revision plus the fence offset: kept within
        // i64 like every other store's, so resources can keep it in a
        // signed 64-bit column (the floor is checked against it).
        .max_fence(i64::MAX as u64)
        .expiry_slack(fixed_expiry_slack(min_ttl))
        .expiry_slack_ttl_percent(SLACK_TTL_PERCENT)
        // Evictions leave a notice the holder follows (see `notify`).
        .eviction_notice(Some(crate::wait::notify::NOTICE)))
}

/// Reads the fence floor: the first read under the prefix, so a user
/// without permission on it is told so now, not at its first lock.
pub(crate) async fn fence_floor(
    client: &Client,
    prefix: &str,
    floor: &Floor,
    timeout: Duration,
) -> Result<(), LockError> {
    let known = timed(timeout, "fence floor", client.kv_client().get(floor.key(), None))
        .await
        .map_err(|e| match e {
            LockError::Store { .. } => LockError::store(
                BACKEND,
                format!(
                    "cannot read under the key prefix {prefix:?} ({e}): the etcd user needs read-write on it \
                     (etcdctl role grant-permission --prefix <role> readwrite {prefix:?})"
                ),
            ),
            other => other,
        })?;
    floor.learn(known.kvs())?;
    Ok(())
}
