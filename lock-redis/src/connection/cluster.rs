//! Redis Cluster (`redis+cluster://`, feature `cluster`): what a
//! connection to one finds and checks, and what is told apart at connect.
//!
//! Each name's keys share one hash tag, so each per-name script runs in
//! one slot, on the primary that owns it; the client's Cluster connection
//! routes it by its first key and follows `MOVED`/`ASK` while slots move.
//! What spans slots is split per slot (`renew_many`, `raise_fence_floor`).
//! Wake-ups and eviction notices are classic `PUBLISH`es, which a Cluster
//! forwards to every node: the subscription listens on one node, any of
//! those given (the next one after a failure).
//!
//! At connect, every primary's persistence and eviction policy is checked
//! as a single server's would be. A URL for one server that reaches a
//! Cluster node, or a Cluster URL that reaches a server without Cluster
//! support, is refused with [`LockError::InvalidConfig`] saying which URL
//! to use.

use lockcore::LockError;

use super::con::Con;

/// What `INFO cluster` says of a server: `Some(true)` for a Cluster node,
/// `None` when it cannot be read (`INFO` denied).
pub(crate) async fn is_cluster_node(con: &mut Con) -> Option<bool> {
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(con)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.trim().strip_prefix("cluster_enabled:"))
        .map(|v| v == "1")
}

/// Refuses a single-server URL that reaches a Cluster node: its scripts
/// would fail on every name whose slot another node owns.
pub(crate) async fn refuse_cluster_node(con: &mut Con, endpoint: &str) -> Result<(), LockError> {
    if is_cluster_node(con).await == Some(true) {
        return Err(LockError::config(format!(
            "{endpoint} is a Redis Cluster node (cluster_enabled:1): connect with \
             redis+cluster://host:port[,host:port...] (lock-redis feature `cluster`)"
        )));
    }
    Ok(())
}

/// Which primary serves each slot, as `CLUSTER SLOTS` said when last
/// read: for sending one renewal script per primary. Read again once
/// older than [`SlotOwners::MAX_AGE`], or forgotten when a renewal found a
/// key its primary no longer serves.
#[derive(Default)]
pub(crate) struct SlotOwners {
    read: std::sync::Mutex<Option<(tokio::time::Instant, std::sync::Arc<Vec<u16>>)>>,
}

impl SlotOwners {
    /// How long a reading is used.
    const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

    /// An owner no primary has: the slot is not served.
    pub(crate) const NONE: u16 = u16::MAX;

    /// Forgets the reading: the next one asks the Cluster.
    pub(crate) fn forget(&self) {
        *self.read.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Per slot, a number for the primary serving it (the same number for
    /// the same primary), or [`NONE`](Self::NONE); `None` when the Cluster
    /// could not be asked.
    pub(crate) async fn get(
        &self,
        commands: &super::commands::Commands,
    ) -> Option<std::sync::Arc<Vec<u16>>> {
        let now = tokio::time::Instant::now();
        if let Some((at, owners)) = &*self.read.lock().unwrap_or_else(|p| p.into_inner())
            && now.duration_since(*at) < Self::MAX_AGE
        {
            return Some(owners.clone());
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let slots: redis::Value = commands.query("CLUSTER SLOTS", &cmd).await.ok()?;
        let owners = std::sync::Arc::new(owners_of(slots)?);
        *self.read.lock().unwrap_or_else(|p| p.into_inner()) = Some((now, owners.clone()));
        Some(owners)
    }
}

/// The owner of each slot in a `CLUSTER SLOTS` reply (see [`SlotOwners::get`]).
fn owners_of(reply: redis::Value) -> Option<Vec<u16>> {
    use redis::Value;
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut owners = vec![SlotOwners::NONE; usize::from(crate::keys::SLOTS)];
    let mut primaries: Vec<Vec<u8>> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        // The primary by host and port (its id is not always sent).
        let who: Vec<u8> = primary
            .iter()
            .take(2)
            .flat_map(|v| match v {
                Value::BulkString(b) => b.clone(),
                Value::SimpleString(s) => s.clone().into_bytes(),
                Value::Int(n) => n.to_string().into_bytes(),
                _ => Vec::new(),
            })
            .collect();
        let owner = match primaries.iter().position(|p| *p == who) {
            Some(i) => i,
            None => {
                primaries.push(who);
                primaries.len() - 1
            }
        };
        let owner = u16::try_from(owner).ok()?;
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        for slot in owners.get_mut(start..=end)? {
            *slot = owner;
        }
    }
    Some(owners)
}

#[cfg(feature = "cluster")]
pub(crate) use enabled::*;

#[cfg(feature = "cluster")]
mod enabled {
    use std::time::Duration;

    use lockcore::LockError;
    use redis::aio::ConnectionManagerConfig;
    use redis::cluster::ClusterClientBuilder;

    use super::super::con::{Con, Opener};
    use super::super::probe::{self, Eviction, Persistence};
    use super::super::{open, within_connect_timeout};
    use super::is_cluster_node;
    use crate::RedisConfig;
    use crate::error::{self};

    /// A connected Cluster: its command connection, how to open another,
    /// a connection to the node that answered first (for the caller's own
    /// commands), and what the checks of its primaries found.
    pub(crate) struct Opened {
        pub(crate) con: Con,
        pub(crate) opener: Opener,
        pub(crate) caller: redis::aio::ConnectionManager,
        pub(crate) persistence: Persistence,
        pub(crate) eviction: Eviction,
    }

    /// Connects to the Cluster `nodes` belong to: the first node that
    /// answers must have Cluster support (else a clear
    /// [`LockError::InvalidConfig`]); then the Cluster connection, and
    /// the checks of every primary (see [`probe::check`]), each within
    /// `limit`.
    pub(crate) async fn open_cluster(
        config: &RedisConfig,
        nodes: &[(String, u16)],
        manager: ConnectionManagerConfig,
        limit: Duration,
    ) -> Result<Opened, LockError> {
        let mut first = None;
        let mut failed = Vec::new();
        for (host, port) in nodes {
            let node = config.node(host, *port);
            let endpoint = node.endpoint();
            match open(&node, &endpoint, manager.clone()).await {
                Ok(con) => {
                    first = Some((Con::Single(con), endpoint));
                    break;
                }
                Err(e) => failed.push(e),
            }
        }
        let Some((mut seed, endpoint)) = first else {
            // Every node failed: the first node's error explains it.
            return Err(failed.swap_remove(0));
        };
        if is_cluster_node(&mut seed).await == Some(false) {
            return Err(LockError::config(format!(
                "{endpoint} is not a Redis Cluster node (cluster_enabled:0): connect to it \
                 with redis://host:port"
            )));
        }
        let Con::Single(caller) = seed.clone() else {
            unreachable!("the seed connection is a single server's")
        };
        let settings = config.client.get_connection_info().redis_settings().clone();
        // Each node as the config reaches the first: credentials, TLS.
        let infos: Vec<redis::ConnectionInfo> = nodes
            .iter()
            .map(|(host, port)| {
                let node = config.node(host, *port);
                node.client.get_connection_info().clone()
            })
            .collect();
        let mut builder = ClusterClientBuilder::new(infos)
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.response_timeout)
            .use_protocol(settings.protocol())
            .retries(3)
            .min_retry_wait(50)
            .max_retry_wait(1000);
        if let Some(user) = settings.username() {
            builder = builder.username(user);
        }
        if let Some(password) = settings.password() {
            builder = builder.password(password);
        }
        if !config.node_map.is_empty() {
            let map = config.node_map.iter().map(|((h, p), (to, tp))| {
                let node =
                    |host: &str, port| redis::cluster::NodeAddress::new(host.to_owned(), port);
                (node(h, *p), node(to, *tp))
            });
            builder = builder.node_address_map(map.collect());
        }
        #[cfg(feature = "tls")]
        if config.uses_tls() {
            builder = builder.certs(config.tls_certificates().for_cluster());
        }
        let client = builder
            .build()
            .map_err(|e| LockError::config(format!("the Cluster nodes: {e}")))?;
        let con = within_connect_timeout(config, &endpoint, client.get_async_connection()).await?;
        let (persistence, eviction) = check_primaries(config, &mut seed, &manager, limit).await?;
        Ok(Opened {
            con: Con::Cluster(con),
            opener: Opener::Cluster(Box::new(client)),
            caller,
            persistence,
            eviction,
        })
    }

    /// Runs the connect checks on every primary `CLUSTER NODES` (asked
    /// through `seed`) lists; reports the least durable persistence and
    /// the first eviction policy that evicts (else the first one).
    async fn check_primaries(
        config: &RedisConfig,
        seed: &mut Con,
        manager: &ConnectionManagerConfig,
        limit: Duration,
    ) -> Result<(Persistence, Eviction), LockError> {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(seed)
            .await
            .map_err(error::map)?;
        let mut found: Option<(Persistence, Eviction)> = None;
        for (host, port) in primaries(&nodes) {
            let node = config.node(&host, port);
            let endpoint = node.endpoint();
            let mut con = Con::Single(open(&node, &endpoint, manager.clone()).await?);
            let (persistence, eviction) = probe::check(&node, &endpoint, &mut con, limit).await?;
            found = Some(match found {
                None => (persistence, eviction),
                Some((p, e)) => (
                    if p.is_durable() { persistence } else { p },
                    if e.evicts() { e } else { eviction },
                ),
            });
        }
        found.ok_or_else(|| {
            LockError::unavailable(error::BACKEND, "CLUSTER NODES lists no reachable primary")
        })
    }

    /// The addresses of the primaries in a `CLUSTER NODES` reply (those
    /// not failed and with an address).
    pub(super) fn primaries(nodes: &str) -> Vec<(String, u16)> {
        nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let flags = fields.get(2)?;
                let primary = flags.split(',').any(|f| f == "master")
                    && !flags
                        .split(',')
                        .any(|f| matches!(f, "fail" | "fail?" | "noaddr" | "handshake"));
                if !primary {
                    return None;
                }
                let addr = fields.get(1)?.split(['@', ',']).next()?;
                let (host, port) = addr.rsplit_once(':')?;
                Some((host.to_owned(), port.parse().ok()?))
            })
            .collect()
    }
}

#[cfg(test)]
mod owner_tests {
    use redis::Value;

    use super::{SlotOwners, owners_of};

    #[test]
    fn slot_owners_are_read_from_cluster_slots() {
        let primary = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |start: i64, end: i64, port: i64| {
            Value::Array(vec![Value::Int(start), Value::Int(end), primary(port)])
        };
        let owners = owners_of(Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10921, 7001),
            range(10923, 16383, 7000),
        ]))
        .unwrap();
        assert_eq!((owners[0], owners[5460], owners[5461]), (0, 0, 1));
        assert_eq!(owners[10922], SlotOwners::NONE);
        assert_eq!(owners[16383], 0);
        assert!(owners_of(Value::Array(vec![range(0, 16384, 7000)])).is_none());
    }
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use super::enabled::primaries;

    #[test]
    fn primaries_are_read_from_cluster_nodes() {
        let nodes = "e7d1 127.0.0.1:30004@31004 slave 67ed 0 1426238317239 4 connected\n\
                     67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922\n\
                     292f 127.0.0.1:30003@31003,host.example master - 0 1426238318243 3 connected 10923-16383\n\
                     6ec2 127.0.0.1:30005@31005 master,fail - 0 1426238316232 5 connected\n\
                     824f 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460\n";
        assert_eq!(
            primaries(nodes),
            vec![
                ("127.0.0.1".to_owned(), 30002),
                ("127.0.0.1".to_owned(), 30003),
                ("127.0.0.1".to_owned(), 30001),
            ]
        );
    }
}
