//! Reading a Redis URL onto a [`RedisConfig`], through lockcore's
//! [`StoreUrl`]: the one parser and option vocabulary of every adapter
//! (`timeout`, `connect_timeout`, `prefix`, `tls_*`, `password_file`),
//! plus what only Redis has (`db`, `protocol`, the server checks).

use lockcore::LockError;
use lockcore::backend::StoreUrl;
use redis::{ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo};

use super::RedisConfig;
use crate::connection::target::Sentinels;

/// The schemes the Redis client itself reads (`valkey` for its fork,
/// `unix` for a socket), and so did `connect` before this parser.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "valkey",
    "valkeys",
    "valkey+unix",
    "redis+sentinel",
    "redis+cluster",
    "rediss+cluster",
];

/// The options a Redis URL may carry, named in the error for any other.
const KNOWN: &[&str] = &[
    "db",
    "protocol",
    "prefix",
    "timeout",
    "connect_timeout",
    "password_file",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "allow_maxmemory_eviction",
    "require_durable_fences",
    "failover_lock_delay",
    "wait_replicas",
    "node_map",
];

/// The Redis port when the URL names none.
const DEFAULT_PORT: u16 = 6379;

/// A sentinel's port when the URL names none.
const SENTINEL_PORT: u16 = 26379;

/// Parses `text` (see [`RedisConfig::from_url`]).
pub(super) fn read(text: &str) -> Result<RedisConfig, LockError> {
    let mut url = StoreUrl::parse(text, SCHEMES)?;
    let shown = without_query(&url);
    let bad = |why: String| LockError::config(format!("{shown}: {why}"));
    let tls = matches!(url.scheme(), "rediss" | "valkeys" | "rediss+cluster");
    if tls && !cfg!(feature = "tls") {
        return Err(bad(
            "needs TLS, but lock-redis was built without its `tls` feature".into(),
        ));
    }
    let unix = url.scheme().ends_with("unix");
    let (old_user, old_password) = if unix {
        (
            old_spelling(&mut url, "user"),
            old_spelling(&mut url, "pass"),
        )
    } else {
        (None, None)
    };
    let sentinel = url.scheme() == "redis+sentinel";
    let cluster = matches!(url.scheme(), "redis+cluster" | "rediss+cluster");
    if cluster && !cfg!(feature = "cluster") {
        return Err(bad(
            "names a Redis Cluster, but lock-redis was built without its `cluster` feature".into(),
        ));
    }
    let mut nodes = None;
    let (addr, db, sentinels) = if sentinel {
        let (sentinels, db) = sentinels(&mut url).map_err(bad)?;
        let (host, port) = sentinels.addrs[0].clone();
        (ConnectionAddr::Tcp(host, port), db, Some(sentinels))
    } else if cluster {
        let seeds = cluster_nodes(&mut url).map_err(bad)?;
        let (host, port) = seeds[0].clone();
        nodes = Some(seeds);
        let addr = if tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        (addr, 0, None)
    } else {
        let addr = address(&url, tls, unix).map_err(bad)?;
        (addr, database(&mut url, unix).map_err(bad)?, None)
    };
    let protocol = match url.take("protocol").as_deref() {
        None | Some("2" | "resp2") => ProtocolVersion::RESP2,
        Some("3" | "resp3") => ProtocolVersion::RESP3,
        Some(_) => return Err(bad("URL option protocol: expected resp2 or resp3".into())),
    };
    let mut settings = RedisConnectionInfo::default()
        .set_db(db)
        .set_protocol(protocol);
    if let Some(user) = url.user().map(str::to_owned).or(old_user) {
        settings = settings.set_username(user);
    }
    if let Some(password) = url.take_password()?.or(old_password) {
        settings = settings.set_password(password);
    }
    let info = addr
        .into_connection_info()
        .map_err(|e| bad(format!("cannot be used: {e}")))?
        .set_redis_settings(settings);
    let client = redis::Client::open(info).map_err(|e| bad(format!("cannot be used: {e}")))?;
    let mut config = RedisConfig::from_client(client);
    config.sentinel = sentinels;
    config.cluster = nodes;
    if let Some(prefix) = url.take("prefix") {
        config.key_prefix = prefix;
    }
    if let Some(timeout) = url.take_duration("timeout")? {
        config.response_timeout = timeout;
    }
    if let Some(timeout) = url.take_duration("connect_timeout")? {
        config.connect_timeout = timeout;
    }
    if let Some(allowed) = url.take_bool("allow_maxmemory_eviction")? {
        config.allow_maxmemory_eviction = allowed;
    }
    if let Some(required) = url.take_bool("require_durable_fences")? {
        config.require_durable_fences = required;
    }
    if let Some(delay) = url.take_duration("failover_lock_delay")? {
        config = config.failover_lock_delay(delay);
    }
    if let Some(replicas) = url.take_u32("wait_replicas")? {
        config = config.wait_replicas(replicas);
    }
    if let Some(map) = url.take("node_map") {
        if !cluster {
            return Err(bad(
                "URL option node_map maps Redis Cluster nodes: use it with redis+cluster://".into(),
            ));
        }
        for (announced, at) in node_map(&map).map_err(bad)? {
            config = config.map_node(announced, at);
        }
    }
    if url.take("tls_domain").is_some() {
        return Err(bad(
            "URL option tls_domain is not supported by lock-redis: the Redis \
             client checks the server's certificate against the URL's host, so connect by \
             the name the certificate carries"
                .into(),
        ));
    }
    let config = certificates(&mut url, config)?;
    url.finish(KNOWN)?;
    Ok(config)
}

/// The pairs of a `node_map` option: `announced=reached` `host:port`
/// pairs, comma-separated.
fn node_map(text: &str) -> Result<Vec<super::NodeMapping>, String> {
    let node = |text: &str| {
        let (host, port) = text.rsplit_once(':')?;
        let port = port.parse::<u16>().ok()?;
        (!host.is_empty()).then(|| (host.to_owned(), port))
    };
    text.split(',')
        .map(|pair| {
            let (announced, at) = pair.split_once('=').unwrap_or((pair, ""));
            node(announced).zip(node(at)).ok_or_else(|| {
                format!(
                    "URL option node_map: {pair:?} is not announced-host:port=reached-host:port"
                )
            })
        })
        .collect()
}

/// Where the server is: one `host[:port]`, or for a socket the path.
fn address(url: &StoreUrl, tls: bool, unix: bool) -> Result<ConnectionAddr, String> {
    if unix {
        if !url.hosts().is_empty() || url.path().is_empty() {
            return Err(
                "a Unix socket URL names the socket's path: redis+unix:///path/to/redis.sock"
                    .into(),
            );
        }
        return Ok(ConnectionAddr::Unix(url.path().into()));
    }
    let [host] = url.hosts() else {
        return Err(format!(
            "names {} hosts; lock-redis connects to one server",
            url.hosts().len()
        ));
    };
    let (host, port) = (host.name.clone(), host.port.unwrap_or(DEFAULT_PORT));
    Ok(if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    })
}

/// The sentinels of a `redis+sentinel://h1:p1,h2:p2/<service>[/<db>]` URL,
/// and the database (the path's second part, or option `db`).
fn sentinels(url: &mut StoreUrl) -> Result<(Sentinels, i64), String> {
    let addrs: Vec<(String, u16)> = url
        .hosts()
        .iter()
        .map(|h| (h.name.clone(), h.port.unwrap_or(SENTINEL_PORT)))
        .collect();
    let path = url.path().trim_matches('/').to_owned();
    let (service, db) = path.split_once('/').unwrap_or((path.as_str(), ""));
    if addrs.is_empty() || service.is_empty() {
        return Err(
            "a Sentinel URL names the sentinels and the primary's service name: \
                    redis+sentinel://host1:26379,host2:26379/mymaster[/db]"
                .into(),
        );
    }
    let db = match (db, url.take("db").as_deref()) {
        ("", None) => 0,
        (text, None) | ("", Some(text)) => text
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or("the database is not a number (redis+sentinel://h/mymaster/2 or ?db=2)")?,
        (_, Some(_)) => return Err("gives the database twice, as its path and as db=".into()),
    };
    let service = service.to_owned();
    Ok((Sentinels { addrs, service }, db))
}

/// The nodes a `redis+cluster://h1:p1,h2:p2[/]` URL names to learn the
/// Cluster's layout from. A Cluster has database 0 only.
fn cluster_nodes(url: &mut StoreUrl) -> Result<Vec<(String, u16)>, String> {
    let nodes: Vec<(String, u16)> = url
        .hosts()
        .iter()
        .map(|h| (h.name.clone(), h.port.unwrap_or(DEFAULT_PORT)))
        .collect();
    if nodes.is_empty() {
        return Err(
            "a Cluster URL names one or more of its nodes: redis+cluster://host1:6379,host2:6379"
                .into(),
        );
    }
    let db = url.take("db");
    if !url.path().trim_matches('/').is_empty() || db.is_some_and(|db| db != "0") {
        return Err("a Redis Cluster has database 0 only: give no database".into());
    }
    Ok(nodes)
}

/// The database: the path (`/2`) of a TCP URL, or option `db`.
fn database(url: &mut StoreUrl, unix: bool) -> Result<i64, String> {
    let path = if unix {
        String::new()
    } else {
        url.path().trim_matches('/').to_owned()
    };
    let number = |text: &str| {
        text.parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or_else(|| "the database is not a number (redis://host/2 or ?db=2)".to_owned())
    };
    match (path.as_str(), url.take("db")) {
        ("", None) => Ok(0),
        ("", Some(db)) => number(&db),
        (path, None) => number(path),
        (_, Some(_)) => Err("gives the database twice, as its path and as db=".into()),
    }
}

/// The PEM files options `tls_ca`, `tls_cert` and `tls_key` name, given
/// to the config as its builder methods would be.
fn certificates(url: &mut StoreUrl, config: RedisConfig) -> Result<RedisConfig, LockError> {
    let ca = url.take_path("tls_ca")?;
    let cert = url.take_path("tls_cert")?;
    let key = url.take_path("tls_key")?;
    if ca.is_none() && cert.is_none() && key.is_none() {
        return Ok(config);
    }
    #[cfg(not(feature = "tls"))]
    {
        Err(LockError::config(format!(
            "{}: TLS options need lock-redis's `tls` feature",
            without_query(url)
        )))
    }
    #[cfg(feature = "tls")]
    {
        let mut config = config;
        if let Some(ca) = ca {
            config = config.tls_root_cert_pem(pem("tls_ca", &ca)?)?;
        }
        match (cert, key) {
            (None, None) => Ok(config),
            (Some(cert), Some(key)) => {
                config.tls_client_identity_pem(pem("tls_cert", &cert)?, pem("tls_key", &key)?)
            }
            _ => Err(LockError::config(format!(
                "{}: URL options tls_cert and tls_key go together",
                without_query(url)
            ))),
        }
    }
}

/// The contents of the PEM file `path` that option `option` names.
#[cfg(feature = "tls")]
fn pem(option: &str, path: &std::path::Path) -> Result<Vec<u8>, LockError> {
    std::fs::read(path).map_err(|e| {
        LockError::config_caused_by(format!("cannot read {option} {}", path.display()), e)
    })
}

/// The Redis client's own query options for a socket's credentials, read
/// until the next release; the user info or `password_file` replace them.
fn old_spelling(url: &mut StoreUrl, option: &str) -> Option<String> {
    let value = url.take(option)?;
    tracing::warn!(
        url = %url.redacted(),
        "URL option {option} is replaced by the URL's user info \
         (redis+unix://user:password@/path) or password_file; it is read until the next release"
    );
    Some(value)
}

/// The URL as errors may show it: redacted, without its query (a value
/// there may be a secret given the wrong name).
fn without_query(url: &StoreUrl) -> String {
    url.redacted()
        .split('?')
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lock_conformance::kit::logs::captured as logged;
    use lock_conformance::kit::secrets;

    use super::*;

    fn config(url: &str) -> RedisConfig {
        RedisConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn refused(url: &str) -> String {
        match RedisConfig::from_url(url) {
            Err(LockError::InvalidConfig { message, .. }) => message,
            other => panic!("{url}: expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn cluster_urls_name_the_nodes_and_no_database() {
        if !cfg!(feature = "cluster") {
            assert!(refused("redis+cluster://a:7000").contains("`cluster` feature"));
            return;
        }
        let read = config("redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2?prefix=app:");
        assert_eq!(
            read.cluster,
            Some(vec![
                ("10.0.0.1".to_owned(), 7000),
                ("10.0.0.2".to_owned(), DEFAULT_PORT)
            ])
        );
        assert_eq!(read.key_prefix, "app:");
        let settings = read.client.get_connection_info().redis_settings();
        assert_eq!(settings.username(), Some("u"));
        assert_eq!(read.endpoint(), "redis://10.0.0.1:7000");
        assert!(config("redis+cluster://h/?db=0").cluster.is_some());
        if cfg!(feature = "tls") {
            let tls = config("rediss+cluster://a:7000,b:7001");
            assert!(tls.uses_tls() && tls.cluster.as_ref().is_some_and(|n| n.len() == 2));
        }
        for bad in ["redis+cluster://h/2", "redis+cluster://h?db=1"] {
            assert!(refused(bad).contains("database 0 only"), "{bad}");
        }
    }

    #[test]
    fn a_node_map_says_where_announced_cluster_nodes_are_reached() {
        assert!(refused("redis://h?node_map=a:1=b:2").contains("redis+cluster://"));
        if !cfg!(feature = "cluster") {
            return;
        }
        let read = config("redis+cluster://a:7000?node_map=10.0.0.1:7000=lb:9001,a:7000=lb:9000");
        assert_eq!(
            read.node_map,
            vec![
                (("10.0.0.1".to_owned(), 7000), ("lb".to_owned(), 9001)),
                (("a".to_owned(), 7000), ("lb".to_owned(), 9000)),
            ]
        );
        let seed = read.node("a", 7000);
        let reached = seed.client.get_connection_info().addr();
        assert_eq!(reached, &ConnectionAddr::Tcp("lb".into(), 9000));
        let unmapped = read.node("b", 7002);
        let reached = unmapped.client.get_connection_info().addr();
        assert_eq!(reached, &ConnectionAddr::Tcp("b".into(), 7002));
        for bad in ["a:1", "a:1=b", "a=b:2", ":1=b:2", "a:1=b:2,"] {
            let url = format!("redis+cluster://h?node_map={bad}");
            assert!(
                refused(&url).contains("announced-host:port=reached-host:port"),
                "{bad}"
            );
        }
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_the_service_and_the_database() {
        let read = config("redis+sentinel://u:pw@10.0.0.1:26380,10.0.0.2/locks/3?prefix=app:");
        let sentinel = read.sentinel.as_ref().expect("a sentinel config");
        assert_eq!(
            sentinel.addrs,
            vec![
                ("10.0.0.1".to_string(), 26380),
                ("10.0.0.2".to_string(), SENTINEL_PORT)
            ]
        );
        assert_eq!(sentinel.service, "locks");
        let settings = read.client.get_connection_info().redis_settings();
        assert_eq!(settings.db(), 3);
        assert_eq!(settings.username(), Some("u"));
        assert_eq!(read.key_prefix, "app:");
        assert_eq!(
            config("redis+sentinel://h/locks?db=2")
                .client
                .get_connection_info()
                .redis_settings()
                .db(),
            2
        );
        for bad in [
            "redis+sentinel://h",
            "redis+sentinel://h/",
            "redis+sentinel://h/locks/x",
            "redis+sentinel://h/locks/2?db=2",
        ] {
            refused(bad);
        }
        assert!(!format!("{read:?}").contains("pw"));
    }

    #[test]
    fn the_shared_options_are_read() {
        let read = config(
            "redis://u:pw@h:7000/3?timeout=250ms&connect_timeout=3s&prefix=app:locks:\
             &protocol=resp3&allow_maxmemory_eviction=true&require_durable_fences=true",
        );
        assert_eq!(read.response_timeout, Duration::from_millis(250));
        assert_eq!(read.connect_timeout, Duration::from_secs(3));
        assert_eq!(read.key_prefix, "app:locks:");
        assert!(read.allow_maxmemory_eviction && read.require_durable_fences);
        let info = read.client.get_connection_info();
        assert_eq!(info.addr(), &ConnectionAddr::Tcp("h".into(), 7000));
        let settings = info.redis_settings();
        assert_eq!(settings.db(), 3);
        assert_eq!(settings.username(), Some("u"));
        assert_eq!(settings.password(), Some("pw"));
        assert_eq!(settings.protocol(), ProtocolVersion::RESP3);

        let defaults = config("redis://[::1]");
        assert_eq!(
            defaults.client.get_connection_info().addr(),
            &ConnectionAddr::Tcp("::1".into(), DEFAULT_PORT)
        );
        assert_eq!(
            defaults.response_timeout,
            RedisConfig::DEFAULT_RESPONSE_TIMEOUT
        );
        assert_eq!(defaults.key_prefix, crate::keys::DEFAULT_PREFIX);
        assert_eq!(
            config("redis://h?db=5")
                .client
                .get_connection_info()
                .redis_settings()
                .db(),
            5
        );
        let socket = config("redis+unix://u:p%40ss@/run/redis.sock?db=2");
        let info = socket.client.get_connection_info();
        assert_eq!(info.addr(), &ConnectionAddr::Unix("/run/redis.sock".into()));
        assert_eq!(info.redis_settings().db(), 2);
        assert_eq!(info.redis_settings().password(), Some("p@ss"));
    }

    #[test]
    fn a_password_file_gives_the_password() {
        let dir = std::env::temp_dir().join(format!("lock-redis-url-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "from-the-file\n").unwrap();
        let read = config(&format!("redis://u@h?password_file={}", file.display()));
        let settings = read.client.get_connection_info().redis_settings().clone();
        assert_eq!(settings.password(), Some("from-the-file"));
        assert_eq!(settings.username(), Some("u"));
        refused(&format!("redis://u:pw@h?password_file={}", file.display()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_old_socket_credentials_still_work_and_warn() {
        let (read, log) = logged(|| config("redis+unix:///run/redis.sock?user=u&pass=old-pw&db=1"));
        let settings = read.client.get_connection_info().redis_settings().clone();
        assert_eq!(
            (settings.username(), settings.password()),
            (Some("u"), Some("old-pw"))
        );
        for option in ["user", "pass"] {
            assert!(
                log.contains(&format!(
                    "URL option {option} is replaced by the URL's user info"
                )),
                "{log}"
            );
        }
        assert!(!log.contains("old-pw"), "{log}");
        // Over TCP the client never read them: they are unknown there.
        assert!(refused("redis://h?pass=x").contains("unknown redis URL option \"pass\""));
    }

    #[test]
    fn bad_values_are_typed_errors_that_show_no_secret() {
        let pw = secrets::encoded();
        for url in [
            format!("redis://u:{pw}@h?timeout={pw}"),
            format!("redis://u:{pw}@h?timeout=30"),
            format!("redis://u:{pw}@h?connect_timeout=fast"),
            format!("redis://u:{pw}@h?allow_maxmemory_eviction={pw}"),
            format!("redis://u:{pw}@h?protocol={pw}"),
            format!("redis://u:{pw}@h?db={pw}"),
            format!("redis://u:{pw}@h/1?db=1"),
            format!("redis://u:{pw}@h1,h2"),
            format!("redis://u:{pw}@h?tls_domain={pw}"),
            format!("redis+unix://u:{pw}@h/sock"),
        ] {
            secrets::assert_hidden(&url, &refused(&url));
        }
        assert!(refused("redis://h?timeout=x").contains("expected a duration"));
        assert!(refused("redis://h?tls_domain=x").contains("not supported"));
    }

    #[test]
    fn an_unknown_option_names_the_known_ones() {
        let message = refused("redis://h?tiemout=1s");
        assert!(
            message.contains("unknown redis URL option \"tiemout\""),
            "{message}"
        );
        for known in KNOWN {
            assert!(message.contains(known), "{known} missing: {message}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_files_are_read_and_checked() {
        let missing = refused("rediss://h?tls_ca=/nonexistent/ca.pem");
        assert!(missing.contains("cannot read tls_ca"), "{missing}");
        let dir = std::env::temp_dir().join(format!("lock-redis-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let junk = junk.display();
        assert!(refused(&format!("rediss://h?tls_ca={junk}")).contains("root CA"));
        assert!(refused(&format!("rediss://h?tls_cert={junk}")).contains("go together"));
        assert!(refused(&format!("redis://h?tls_ca={junk}")).contains("root CA"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
