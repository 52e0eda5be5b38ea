//! A Redis Cluster on loopback: three primaries, no replicas, each a
//! durable `redis-server --cluster-enabled yes` (AOF, `appendfsync
//! always`) in its own data dir, joined with `redis-cli --cluster create`;
//! ready once every node says `cluster_state:ok` and knows all three. Or
//! the Cluster `LOCK_TEST_REDIS_CLUSTER_URL` names
//! (`redis+cluster://host:port[,host:port...]`). Its URL is
//! `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
//!
//! [`crate::redis_cluster`] runs the conformance suite against it. The Cluster is the
//! store the fault cases kill, pause and restart (every node at once; a
//! restart waits until the Cluster is formed again), and crash cases get a
//! private Cluster of their own. The cases that cut one client's link
//! through the suite's fault proxy cannot apply: a Cluster client learns
//! every node's address from the Cluster and connects there, around any
//! proxy.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::{Kind, Store, redis};
use crate::kit::poll;
use crate::kit::{env, net};

/// Primaries of the launched Cluster.
const PRIMARIES: usize = 3;

/// A running Redis Cluster (or the external one the variable names).
pub struct RedisCluster {
    /// The launched nodes (none for an external Cluster).
    pub nodes: Vec<Store>,
    url: String,
    /// With TLS: the CA file the nodes' certificates come from.
    tls_ca: Option<PathBuf>,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("url", &self.url)
            .field("nodes", &self.nodes.len())
            .field("tls", &self.tls_ca.is_some())
            .finish()
    }
}

impl RedisCluster {
    /// `redis+cluster://` with every node.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Whether the Cluster was launched elsewhere
    /// (`LOCK_TEST_REDIS_CLUSTER_URL`).
    pub fn is_external(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Waits until every node says `cluster_state:ok`, knows every
    /// primary and sees every slot served.
    pub fn wait_formed(&self) -> io::Result<()> {
        let within = env::scaled(Duration::from_secs(30));
        for node in &self.nodes {
            let port = node.addr().port();
            poll::blocking(within, "every Cluster node says cluster_state:ok", || {
                let info = cli(port, self.tls_ca.as_deref(), &["cluster", "info"])?;
                let formed = info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && info.contains("cluster_slots_ok:16384");
                Ok::<_, io::Error>(formed.then_some(()))
            })?;
        }
        Ok(())
    }

    /// Runs `redis-cli -h 127.0.0.1 -p <node's port> args...`; its output,
    /// or an error with it when it fails.
    pub fn cli(&self, node: usize, args: &[&str]) -> io::Result<String> {
        cli(self.nodes[node].addr().port(), self.tls_ca.as_deref(), args)
    }
}

/// Starts a private three-primary Cluster of durable nodes, waiting until
/// it is formed.
pub fn start() -> io::Result<RedisCluster> {
    start_with(redis::Options::durable())
}

/// [`start`] with each node launched with `options`. With TLS
/// ([`redis::Options::tls`]) the Cluster bus is TLS too, and the URL is
/// `rediss+cluster://...?tls_ca=PATH`.
pub fn start_with(options: redis::Options) -> io::Result<RedisCluster> {
    launch(options, 0, "5000")
}

/// Three primaries with `replicas` replicas each (durable nodes), whose
/// Cluster takes a node that does not answer for 1 s for failed: killing
/// a primary promotes one of its replicas within a few seconds. The nodes
/// are in `redis-cli --cluster create` order: the primaries first.
pub fn start_with_replicas(replicas: usize) -> io::Result<RedisCluster> {
    launch(redis::Options::durable(), replicas, "1000")
}

/// Launches `3 * (1 + replicas)` nodes with `options` and joins them.
fn launch(
    options: redis::Options,
    replicas: usize,
    node_timeout: &str,
) -> io::Result<RedisCluster> {
    if super::which("redis-cli").is_none() {
        return Err(super::missing(Kind::Redis, "redis-cli"));
    }
    let tls = options.tls.is_some();
    let mut args = vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        node_timeout,
    ];
    if tls {
        args.extend(["--tls-cluster", "yes"]);
    }
    // Each node's bus port chosen as its client port is (by default it is
    // the client port + 10000, in Linux's ephemeral range, where an
    // outgoing connection of the busy test run may hold it).
    let nodes = (0..PRIMARIES * (1 + replicas))
        .map(|_| {
            let bus = net::free_port()?.to_string();
            let node_args = args.iter().copied().chain(["--cluster-port", &bus]);
            redis::start(options.clone().server_args(node_args))
        })
        .collect::<io::Result<Vec<Store>>>()?;
    let tls_ca = tls
        .then(|| nodes[0].data_dir().map(|dir| dir.join("tls-ca.crt")))
        .flatten();
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(addrs.iter().map(String::as_str));
    let replicas = replicas.to_string();
    create.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
    cli(nodes[0].addr().port(), tls_ca.as_deref(), &create)?;
    let url = match &tls_ca {
        Some(ca) => format!(
            "rediss+cluster://{}?tls_ca={}",
            addrs.join(","),
            ca.display()
        ),
        None => format!("redis+cluster://{}", addrs.join(",")),
    };
    let cluster = RedisCluster { url, nodes, tls_ca };
    cluster.wait_formed()?;
    Ok(cluster)
}

/// Runs `redis-cli` against `127.0.0.1:port` (over TLS trusting `tls_ca`).
fn cli(port: u16, tls_ca: Option<&Path>, args: &[&str]) -> io::Result<String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(ca) = tls_ca {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    let output = cmd.args(args).stdin(std::process::Stdio::null()).output()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || text.starts_with("ERR") || text.contains("[ERR]") {
        return Err(io::Error::other(format!(
            "redis-cli -p {port} {}: {text}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(text)
}

static SHARED: OnceLock<Result<Arc<RedisCluster>, (io::ErrorKind, String)>> = OnceLock::new();

/// The Cluster of this test binary, or the one `LOCK_TEST_REDIS_CLUSTER_URL`
/// names.
///
/// # Panics
/// When it cannot be started, with what to install.
pub fn shared() -> Arc<RedisCluster> {
    try_shared().unwrap_or_else(|e| panic!("redis cluster unavailable: {e}"))
}

/// [`shared`] without the panic.
pub fn try_shared() -> io::Result<Arc<RedisCluster>> {
    let result = SHARED.get_or_init(|| {
        let cluster = match env::REDIS_CLUSTER_URL.get() {
            Some(url) => Ok(RedisCluster {
                nodes: Vec::new(),
                url,
                tls_ca: None,
            }),
            None => start(),
        };
        match cluster {
            Ok(cluster) => {
                for node in &cluster.nodes {
                    if let (Some(pid), Some(dir)) = (node.pid(), node.data_dir()) {
                        super::shared::register_cleanup(pid, dir.to_owned());
                    }
                }
                Ok(Arc::new(cluster))
            }
            Err(e) => Err((e.kind(), e.to_string())),
        }
    });
    match result {
        Ok(cluster) => Ok(cluster.clone()),
        Err((kind, message)) => Err(io::Error::new(*kind, message.clone())),
    }
}
