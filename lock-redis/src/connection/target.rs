//! Where the primary is: one address, or whatever Redis Sentinel names;
//! for a Redis Cluster, the node the subscription listens on.
//!
//! With Sentinel (`redis+sentinel://`), the primary moves at each failover.
//! The command connection and the subscription ask the sentinels again
//! whenever their link fails (or a write is refused by a demoted server,
//! `READONLY`), and reconnect to the primary they name, which Sentinel has
//! checked with `ROLE`. Between the failover and that question, requests
//! fail retryably, as they would with any moving address.

use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use lockcore::LockError;
use redis::IntoConnectionInfo;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};

use crate::error::{self, BACKEND};

/// The sentinels to ask, and the name they monitor the primary under.
#[derive(Debug, Clone)]
pub(crate) struct Sentinels {
    pub(crate) addrs: Vec<(String, u16)>,
    pub(crate) service: String,
}

/// The client of the current primary.
pub(crate) struct Target {
    current: RwLock<redis::Client>,
    sentinel: Option<tokio::sync::Mutex<SentinelClient>>,
    /// A Redis Cluster's nodes given: the subscription, which any node
    /// serves (a Cluster forwards `PUBLISH` to all), moves to the next
    /// after a failure.
    nodes: Vec<redis::Client>,
    next: AtomicUsize,
}

impl Target {
    /// A primary at a fixed address (`client`'s).
    pub(crate) fn fixed(client: redis::Client) -> Target {
        Target {
            current: RwLock::new(client),
            sentinel: None,
            nodes: Vec::new(),
            next: AtomicUsize::new(0),
        }
    }

    /// The nodes of a Redis Cluster (`nodes`, reached with `config`'s
    /// credentials and TLS settings), the first one current.
    pub(crate) fn nodes(config: &crate::RedisConfig, nodes: &[(String, u16)]) -> Target {
        let nodes: Vec<redis::Client> = nodes
            .iter()
            .map(|(host, port)| config.node(host, *port).client)
            .collect();
        Target {
            current: RwLock::new(nodes.first().unwrap_or(&config.client).clone()),
            sentinel: None,
            nodes,
            next: AtomicUsize::new(1),
        }
    }

    /// The primary `sentinels` name now, reached with `template`'s
    /// credentials and database.
    pub(crate) async fn sentinel(
        sentinels: &Sentinels,
        template: &redis::Client,
    ) -> Result<Target, LockError> {
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(template.get_connection_info().redis_settings().clone());
        let addrs: Vec<redis::ConnectionInfo> = sentinels
            .addrs
            .iter()
            .map(|(host, port)| {
                redis::ConnectionAddr::Tcp(host.clone(), *port).into_connection_info()
            })
            .collect::<Result<_, _>>()
            .map_err(|e| LockError::config(format!("a sentinel address: {e}")))?;
        let mut client = SentinelClient::build(
            addrs,
            sentinels.service.clone(),
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|e| LockError::config(format!("the sentinels: {e}")))?;
        let primary = client.async_get_client().await.map_err(|e| {
            LockError::unavailable(
                BACKEND,
                format!(
                    "no sentinel named a primary for {:?}: {}",
                    sentinels.service,
                    error::map(e)
                ),
            )
        })?;
        Ok(Target {
            current: RwLock::new(primary),
            sentinel: Some(tokio::sync::Mutex::new(client)),
            nodes: Vec::new(),
            next: AtomicUsize::new(0),
        })
    }

    /// The current primary's client.
    pub(crate) fn client(&self) -> redis::Client {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether this is a Redis Cluster's.
    pub(crate) fn is_cluster(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// Whether the primary is found through Sentinel.
    pub(crate) fn moves(&self) -> bool {
        self.sentinel.is_some()
    }

    /// Asks the sentinels again (a link failed, or a write was refused as
    /// on a replica), and takes the primary they name. Each user compares
    /// its own connection's server with [`client`](Self::client) after.
    pub(crate) async fn refresh(&self) {
        if !self.nodes.is_empty() {
            let next = self.next.fetch_add(1, Ordering::Relaxed) % self.nodes.len();
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = self.nodes[next].clone();
            return;
        }
        let Some(sentinel) = &self.sentinel else {
            return;
        };
        let found = sentinel.lock().await.async_get_client().await;
        let primary = match found {
            Ok(primary) => primary,
            Err(e) => {
                tracing::debug!(error = %e, "no sentinel named a primary");
                return;
            }
        };
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        let moved = current.get_connection_info().addr() != primary.get_connection_info().addr();
        if moved {
            tracing::warn!(
                primary = %primary.get_connection_info().addr(),
                "sentinel names another primary: reconnecting to it"
            );
            *current = primary;
        }
    }
}

/// Whether `e` says the link to the primary failed, or that the server is
/// no longer the primary: time to ask the sentinels.
pub(crate) fn calls_for_refresh(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
        || e.is_io_error()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}
