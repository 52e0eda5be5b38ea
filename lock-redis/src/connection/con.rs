//! The command connection, to one server or to a Redis Cluster: one type
//! the rest of the adapter sends its requests through, and how a new one
//! is opened when the current one is replaced (`commands.rs`).
//!
//! A Cluster connection routes each script by its first key (every key of
//! a name shares one hash tag, so one slot), follows `MOVED` and `ASK`,
//! and learns the new layout when slots move; `SCRIPT LOAD` after a
//! `NOSCRIPT` goes to every primary.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::target::Target;

/// The connection commands go through.
#[derive(Clone)]
pub(crate) enum Con {
    /// One server (or the primary Sentinel names), reconnected on failure.
    Single(ConnectionManager),
    /// A Redis Cluster: a connection per node, each request routed by key.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Con {
    /// Whether requests go to a Cluster (each one to its key's slot).
    pub(crate) fn is_cluster(&self) -> bool {
        !matches!(self, Con::Single(_))
    }
}

impl ConnectionLike for Con {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Con::Single(con) => con.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Con::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Con::Single(con) => con.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Con::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Con::Single(con) => con.get_db(),
            #[cfg(feature = "cluster")]
            Con::Cluster(con) => con.get_db(),
        }
    }
}

/// How a replacement command connection is opened: connected on first use.
#[derive(Clone)]
pub(crate) enum Opener {
    /// A connection manager to the target's server.
    Single(ConnectionManagerConfig),
    /// A Cluster connection from the nodes the client was given.
    #[cfg(feature = "cluster")]
    Cluster(Box<redis::cluster::ClusterClient>),
}

impl Opener {
    /// A new connection, connected on first use, and the server it goes to
    /// (for a Cluster, the first node it was given).
    pub(crate) fn lazy(&self, target: &Target) -> Option<(Con, redis::ConnectionAddr)> {
        let client = target.client();
        let to = client.get_connection_info().addr().clone();
        let con = match self {
            Opener::Single(config) => {
                ConnectionManager::new_lazy_with_config(client, config.clone())
                    .map_err(|e| tracing::warn!(error = %e, "could not set up a redis connection"))
                    .ok()
                    .map(Con::Single)?
            }
            #[cfg(feature = "cluster")]
            Opener::Cluster(cluster) => {
                Con::Cluster(cluster.get_pending_async_connection_with_config(
                    redis::cluster::ClusterConfig::default(),
                ))
            }
        };
        Some((con, to))
    }
}
