//! `RedisConfig`: where the server is, how to reach it, and the lock options.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lockcore::LockError;
use redis::ConnectionAddr;
use redis::aio::ConnectionManager;

use crate::keys::{self, DEFAULT_PREFIX};

mod url;

/// How to connect a [`RedisBackend`](crate::RedisBackend), from a URL or an
/// existing [`redis::Client`], plus the lock options.
///
/// URLs: `redis://[user[:password]@]host[:port][/db][?options]`,
/// `rediss://...` for TLS (feature `tls`, on by default),
/// `redis+unix:///path[?options]`, and
/// `redis+sentinel://[user[:password]@]host:port[,host:port...]/service[/db][?options]`
/// to find the primary through Redis Sentinel (the sentinels at the hosts
/// given, default port 26379, monitoring it as `service`; the user and
/// password are the primary's), and
/// `redis+cluster://[user[:password]@]host:port[,host:port...][?options]`
/// (`rediss+cluster://` for TLS) for a Redis Cluster (feature `cluster`; any of its nodes, default port
/// 6379: the client learns the rest, and follows `MOVED`/`ASK`). The options are the crate README's
/// table: `timeout`, `connect_timeout` (durations: `500ms`, `2s`), `prefix`,
/// `db`, `protocol`, `password_file`, `tls_ca` / `tls_cert` / `tls_key`
/// (PEM files), `allow_maxmemory_eviction`, `require_durable_fences`; each
/// has a builder method of the same meaning. `Debug` never shows the
/// password or key material.
///
/// ```
/// use std::time::Duration;
/// use lock_redis::RedisConfig;
///
/// let config = RedisConfig::from_url("redis://locks:s3cret@10.0.0.5:6379/2?timeout=500ms")?
///     .key_prefix("billing:locks:");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// let same = RedisConfig::from_url("redis://locks:s3cret@10.0.0.5:6379/2?prefix=billing:locks:")?
///     .response_timeout(Duration::from_millis(500));
/// assert_eq!(format!("{config:?}"), format!("{same:?}"));
/// # Ok::<(), lockcore::LockError>(())
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) client: redis::Client,
    pub(crate) connection: Option<ConnectionManager>,
    pub(crate) key_prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) require_durable_fences: bool,
    pub(crate) allow_maxmemory_eviction: bool,
    pub(crate) failover_lock_delay: Option<Duration>,
    pub(crate) wait_replicas: Option<u32>,
    /// Found through Sentinel (`redis+sentinel://`): `client` then carries
    /// the credentials and database, and the primary's address is asked.
    pub(crate) sentinel: Option<crate::connection::target::Sentinels>,
    /// A Redis Cluster (`redis+cluster://`): the nodes to learn its layout
    /// from; `client` then carries the credentials and reaches the first.
    pub(crate) cluster: Option<Vec<(String, u16)>>,
    /// Where to reach Cluster nodes that announce an address the client
    /// cannot reach: announced `(host, port)` to reached `(host, port)`.
    pub(crate) node_map: Vec<NodeMapping>,
    #[cfg(feature = "tls")]
    tls: crate::connection::tls::Certificates,
}

impl RedisConfig {
    /// Default time to establish a connection.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default time to wait for a reply.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

    /// Parses a `redis://`, `rediss://` or `redis+unix://` URL (see the
    /// type's docs for the forms and options). Nothing is connected yet.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a URL the client cannot use, an
    /// option that is unknown (the message names the known ones) or has a
    /// bad value, or a PEM file that cannot be read or used. The message
    /// never contains the password, nor any option's value.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        url::read(url)
    }

    /// Uses an existing client (any connection info, TLS settings included)
    /// with default lock options.
    pub fn from_client(client: redis::Client) -> Self {
        RedisConfig {
            client,
            connection: None,
            key_prefix: DEFAULT_PREFIX.to_string(),
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            require_durable_fences: false,
            allow_maxmemory_eviction: false,
            failover_lock_delay: None,
            wait_replicas: None,
            sentinel: None,
            cluster: None,
            node_map: Vec::new(),
            #[cfg(feature = "tls")]
            tls: Default::default(),
        }
    }

    /// Sends lock commands over this existing connection manager instead of
    /// opening one. The client still opens the one pub/sub connection that
    /// wakes waiters. One server's only: a Redis Cluster client refuses it
    /// at connect.
    pub fn connection(mut self, manager: ConnectionManager) -> Self {
        self.connection = Some(manager);
        self
    }

    /// Prefix of every key and channel (default `distlock:`). 1 to 128
    /// printable ASCII characters, no spaces or braces; checked at connect.
    /// The URL form is `?prefix=app:locks:`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Time to establish a connection (default 2 s). The URL form is
    /// `?connect_timeout=2s`.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time to wait for a reply (default 1 s). An operation that waits longer
    /// fails with a retryable [`LockError::Unavailable`]. The URL form is
    /// `?timeout=1s`.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// After a failover to a replica (a new replication id, see the
    /// README's "Failover to a replica"), grants nothing for `delay` from
    /// the moment it is first seen (`failover_lock_delay`; off by default).
    /// With asynchronous replication the old primary's last grants may be
    /// missing on the promoted replica while their holders still work: a
    /// delay of at least the longest TTL in use, plus the expiry slack and
    /// the holders' renewal interval, lets every such lease run out first,
    /// so no two holders overlap, at the cost of that long without grants.
    /// Set it alike on every client: the first grant on the promoted server
    /// records when grants resume. Needs `INFO` (the ACL's `+info`): connect
    /// refuses it otherwise. [`capabilities`](lockcore::LockBackend::capabilities)
    /// reports it as [`Failover::LockDelay`](lockcore::Failover::LockDelay).
    /// The URL form is `?failover_lock_delay=15s`.
    pub fn failover_lock_delay(mut self, delay: Duration) -> Self {
        self.failover_lock_delay = (!delay.is_zero()).then_some(delay);
        self
    }

    /// The lossless mode (`wait_replicas`; off by default): each grant and
    /// each renewal is sent with `WAIT replicas` in one request, and counts
    /// only once that many replicas acknowledged it (within half the
    /// response timeout); a grant they did not is released and the call fails with a
    /// retryable [`LockError::Unavailable`], a renewal is not adopted. A
    /// promoted replica that acknowledged then has every lease a client
    /// believes it holds: set `replicas` to the number of replicas that can
    /// be promoted. Costs a round trip to the replicas per grant and renewal,
    /// and grants stop while fewer replicas are connected. 0 turns it off.
    /// [`capabilities`](lockcore::LockBackend::capabilities) reports it as
    /// [`Failover::Synchronous`](lockcore::Failover::Synchronous). The URL
    /// form is `?wait_replicas=1`.
    pub fn wait_replicas(mut self, replicas: u32) -> Self {
        self.wait_replicas = (replicas > 0).then_some(replicas);
        self
    }

    /// Reaches the Redis Cluster node that announces itself as `announced`
    /// (in `CLUSTER SLOTS`, `MOVED` and `ASK`, and as a node of the URL) at
    /// `at` instead: for nodes behind NAT, container port mappings or
    /// proxies. The URL form is
    /// `?node_map=10.0.0.1:6379=redis-a:7001,10.0.0.2:6379=redis-b:7002`.
    pub fn map_node(
        mut self,
        announced: (impl Into<String>, u16),
        at: (impl Into<String>, u16),
    ) -> Self {
        let announced = (announced.0.into(), announced.1);
        self.node_map.retain(|(from, _)| *from != announced);
        self.node_map.push((announced, (at.0.into(), at.1)));
        self
    }

    /// This configuration for the Cluster node announced as `host:port`,
    /// reached where [`map_node`](Self::map_node) says.
    pub(crate) fn node(&self, host: &str, port: u16) -> RedisConfig {
        let mapped = self
            .node_map
            .iter()
            .find(|((h, p), _)| h == host && *p == port)
            .map(|(_, at)| at.clone());
        let (host, port) = mapped.unwrap_or_else(|| (host.to_owned(), port));
        self.clone().address(host, port)
    }

    /// Refuses to connect unless the server runs `appendonly yes` with
    /// `appendfsync always`, the one setting under which fencing tokens
    /// survive a machine crash without relying on the server's clock.
    /// Off by default: the connection then logs a warning instead. The URL
    /// form is `?require_durable_fences=true`.
    pub fn require_durable_fences(mut self, required: bool) -> Self {
        self.require_durable_fences = required;
        self
    }

    /// Connects even though the server may evict keys when memory runs
    /// short (`maxmemory` set, `maxmemory-policy` other than `noeviction`),
    /// or its policy cannot be read (an ACL denies both `CONFIG GET` and
    /// `INFO`), which `connect` otherwise refuses: a held lock's key can
    /// then vanish and a second client be granted the lock (and under
    /// `allkeys-*` policies fence keys can vanish too). Fencing tokens still
    /// tell the two holders apart. With this set,
    /// `capabilities().fence_durability` names the policy (or says it is
    /// unknown) and what it costs, and `connect` logs a warning.
    /// The URL form is `?allow_maxmemory_eviction=true`. Off by default.
    pub fn allow_maxmemory_eviction(mut self, allowed: bool) -> Self {
        self.allow_maxmemory_eviction = allowed;
        self
    }

    /// Trusts the CA certificate(s) in `pem` for a `rediss://` server, in
    /// place of the system roots: for servers whose certificate a private CA
    /// issued. Builder methods rather than URL parameters, because a URL
    /// cannot carry a PEM file and should not name local paths.
    /// Certificates an existing client (`from_client`) carried are replaced.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when `pem` holds no well-formed
    /// certificate, or the URL is not `rediss://`.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert_pem(mut self, pem: impl AsRef<[u8]>) -> Result<Self, LockError> {
        self.tls.set_root(pem.as_ref())?;
        self.rebuild_tls()
    }

    /// Presents this client certificate (PEM, leaf first) and its private
    /// key (PEM: PKCS#8, PKCS#1 or SEC1), for servers with
    /// `tls-auth-clients yes`. The URL form is
    /// `?tls_cert=/path/to/client.pem&tls_key=/path/to/client.key`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for malformed PEM, a key that does not
    /// belong to the certificate, or a URL that is not `rediss://`. The
    /// message never contains the key.
    #[cfg(feature = "tls")]
    pub fn tls_client_identity_pem(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, LockError> {
        self.tls.set_identity(cert_pem.as_ref(), key_pem.as_ref())?;
        self.rebuild_tls()
    }

    /// The client again, with every certificate given so far.
    #[cfg(feature = "tls")]
    fn rebuild_tls(mut self) -> Result<Self, LockError> {
        self.client = self.tls.apply(&self.client)?;
        self.connection = None;
        Ok(self)
    }

    /// Reaches the same server (credentials, database, TLS settings) through
    /// another address, e.g. a proxy.
    pub fn address(mut self, host: impl Into<String>, port: u16) -> Self {
        let info = self.client.get_connection_info().clone();
        let addr = match info.addr().clone() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.into(),
                port,
                insecure,
                tls_params,
            },
            _ => ConnectionAddr::Tcp(host.into(), port),
        };
        // Same connection info with another address: opening cannot fail.
        if let Ok(client) = redis::Client::open(info.set_addr(addr)) {
            self.client = client;
            self.connection = None;
            self.sentinel = None;
        }
        self
    }

    /// The client this configuration connects with.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    pub(crate) fn validate(&self) -> Result<(), LockError> {
        keys::validate_prefix(&self.key_prefix)?;
        for (what, d) in [
            ("connect timeout", self.connect_timeout),
            ("response timeout", self.response_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                return Err(LockError::config(format!(
                    "{what} {d:?} must be between 1 ns and 1 h"
                )));
            }
        }
        Ok(())
    }

    /// The certificates given for TLS (beyond the system roots), for a
    /// Cluster client.
    #[cfg(all(feature = "tls", feature = "cluster"))]
    pub(crate) fn tls_certificates(&self) -> &crate::connection::tls::Certificates {
        &self.tls
    }

    pub(crate) fn uses_tls(&self) -> bool {
        matches!(
            self.client.get_connection_info().addr(),
            ConnectionAddr::TcpTls { .. }
        )
    }

    /// The server address, for logs and `Debug`.
    pub(crate) fn endpoint(&self) -> String {
        match self.client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}"),
            ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{host}:{port}"),
            ConnectionAddr::Unix(path) => format!("redis+unix://{}", path.display()),
            other => format!("{other:?}"),
        }
    }
}

impl FromStr for RedisConfig {
    type Err = LockError;
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        RedisConfig::from_url(url)
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = self.client.get_connection_info().redis_settings();
        let mut shown = f.debug_struct("RedisConfig");
        shown
            .field("endpoint", &self.endpoint())
            .field("db", &settings.db())
            .field("username", &settings.username())
            .field("password", &settings.password().map(|_| "<redacted>"))
            .field("shared_connection", &self.connection.is_some())
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("require_durable_fences", &self.require_durable_fences)
            .field("allow_maxmemory_eviction", &self.allow_maxmemory_eviction)
            .field("failover_lock_delay", &self.failover_lock_delay)
            .field("wait_replicas", &self.wait_replicas)
            .field("sentinel", &self.sentinel)
            .field("cluster", &self.cluster)
            .field("node_map", &self.node_map);
        #[cfg(feature = "tls")]
        shown.field("tls_custom_root", &self.tls.has_root()).field(
            "tls_client_identity",
            &self.tls.has_identity().then_some("<redacted>"),
        );
        shown.finish()
    }
}

/// A Cluster node's announced `(host, port)` and where it is reached.
pub(crate) type NodeMapping = ((String, u16), (String, u16));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_errors_never_show_the_password() {
        let config = RedisConfig::from_url("redis://alice:hunter2@127.0.0.1:6390/3").unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("alice") && shown.contains("<redacted>") && shown.contains("6390"));
        let err = RedisConfig::from_url("redis://alice:hunter2@127.0.0.1:notaport/3").unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig { .. }));
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for bad in [
            "",
            "nope",
            "http://127.0.0.1:6379",
            "redis://127.0.0.1:6379/notadb",
        ] {
            assert!(
                matches!(
                    RedisConfig::from_url(bad),
                    Err(LockError::InvalidConfig { .. })
                ),
                "{bad}"
            );
        }
        assert!("redis://127.0.0.1".parse::<RedisConfig>().is_ok());
    }

    #[test]
    fn options_are_validated() {
        let base = RedisConfig::from_url("redis://127.0.0.1").unwrap();
        assert!(base.validate().is_ok());
        assert!(base.clone().key_prefix("a{b").validate().is_err());
        assert!(
            base.clone()
                .response_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            base.clone()
                .connect_timeout(Duration::MAX)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn the_eviction_opt_in_reads_from_the_url() {
        let allowed = |url: &str| RedisConfig::from_url(url).map(|c| c.allow_maxmemory_eviction);
        assert!(!allowed("redis://127.0.0.1").unwrap());
        assert!(allowed("redis://127.0.0.1/2?allow_maxmemory_eviction=true").unwrap());
        assert!(allowed("redis://127.0.0.1?protocol=resp2&allow_maxmemory_eviction=true").unwrap());
        assert!(!allowed("redis://127.0.0.1?allow_maxmemory_eviction=false").unwrap());
        assert!(allowed("redis+unix:///tmp/r.sock?db=1&allow_maxmemory_eviction=true").unwrap());
        for bad in ["yes", "", "1", "TRUE"] {
            let url = format!("redis://127.0.0.1?allow_maxmemory_eviction={bad}");
            assert!(
                matches!(allowed(&url), Err(LockError::InvalidConfig { .. })),
                "{url}"
            );
        }
        let config = RedisConfig::from_url("redis://127.0.0.1").unwrap();
        assert!(
            config
                .allow_maxmemory_eviction(true)
                .allow_maxmemory_eviction
        );
    }

    #[test]
    fn address_keeps_credentials_and_database() {
        let config = RedisConfig::from_url("redis://bob:pw@10.1.2.3:6379/4")
            .unwrap()
            .address("127.0.0.1", 7000);
        let info = config.client().get_connection_info();
        assert_eq!(info.addr(), &ConnectionAddr::Tcp("127.0.0.1".into(), 7000));
        assert_eq!(info.redis_settings().db(), 4);
        assert_eq!(info.redis_settings().password(), Some("pw"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn rediss_is_tls() {
        let config = RedisConfig::from_url("rediss://example.com:6380").unwrap();
        assert!(config.uses_tls());
        assert!(config.endpoint().starts_with("rediss://"));
    }
}
