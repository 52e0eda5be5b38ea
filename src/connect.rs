//! `connect(url)`: a backend chosen by URL scheme, for configuration-driven
//! programs and the CLI.

use std::sync::Arc;

use lockcore::backend::redact_url;
use lockcore::{LockBackend, LockError, MemoryBackend};

/// Every scheme distlock knows, with the cargo feature that enables it.
pub const SCHEMES: &[(&str, &str)] = &[
    ("memory", "(always)"),
    ("sqlite", "sqlite"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+unix", "redis"),
    ("redis+sentinel", "redis"),
    ("redis+cluster", "redis-cluster"),
    ("rediss+cluster", "redis-cluster"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
    ("zk", "zookeeper"),
    ("zookeeper", "zookeeper"),
    ("zks", "zookeeper-tls"),
];

/// Connects the backend `url` names:
///
/// | scheme | backend | feature |
/// |---|---|---|
/// | `memory://` | [`MemoryBackend`] (this process only) | always |
/// | `sqlite://PATH` (`sqlite:///abs.db`, `sqlite://rel.db`) | a SQLite lock file shared by the processes of one host (`lock_sqlite::SqliteBackend`) | `sqlite` |
/// | `redis://`, `rediss://` (TLS), `redis+unix://`, `redis+sentinel://` | Redis (`lock_redis::RedisBackend`) | `redis` |
/// | `redis+cluster://host:port[,host:port...]`, `rediss+cluster://` (TLS) | Redis Cluster (`lock_redis::RedisBackend`) | `redis-cluster` |
/// | `postgres://`, `postgresql://` (TLS from `sslmode`) | PostgreSQL (`lock_postgres::PostgresBackend`) | `postgres` |
/// | `etcd://`, `etcds://` (TLS) | etcd v3 (`lock_etcd::EtcdBackend`) | `etcd` |
/// | `zk://`, `zookeeper://`, `zks://` (TLS) | ZooKeeper (`lock_zookeeper::ZooKeeperBackend`) | `zookeeper` (`zookeeper-tls` for `zks://`, `zookeeper-sasl` for `?auth=sasl`) |
///
/// # Errors
/// [`LockError::InvalidConfig`] for a URL without a scheme, an unknown
/// scheme, or one whose feature was not compiled in (the message names the
/// feature); the backend's own errors otherwise. No error shows the URL but
/// through [`redact_url`](lockcore::backend::redact_url), and none a password.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    // `sqlite::memory:` has no `//`: let the SQLite backend refuse it by name.
    let scheme = if url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("sqlite:"))
    {
        "sqlite".to_owned()
    } else {
        scheme_of(url).ok_or_else(|| {
            LockError::config(format!(
                "the lock store URL is not scheme://... ({})",
                redact_url(url)
            ))
        })?
    };
    match scheme.as_str() {
        "memory" => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(lock_sqlite::SqliteBackend::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" | "redis+sentinel" => {
            Ok(Arc::new(lock_redis::RedisBackend::connect(url).await?))
        }
        #[cfg(feature = "redis-cluster")]
        "redis+cluster" | "rediss+cluster" => {
            Ok(Arc::new(lock_redis::RedisBackend::connect(url).await?))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(
            lock_postgres::PostgresBackend::connect(url).await?,
        )),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Arc::new(lock_etcd::EtcdBackend::connect(url).await?)),
        #[cfg(feature = "zookeeper")]
        "zk" | "zookeeper" | "zks" => Ok(Arc::new(
            lock_zookeeper::ZooKeeperBackend::connect(url).await?,
        )),
        other => Err(LockError::config(
            match SCHEMES.iter().find(|(s, _)| *s == other) {
                Some((_, feature)) => format!(
                    "distlock was built without the `{feature}` feature needed for {other}:// URLs"
                ),
                None => format!(
                    "unknown lock store scheme {other:?}; known schemes: {}",
                    SCHEMES
                        .iter()
                        .map(|(s, _)| *s)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        )),
    }
}

/// The scheme of `scheme://...`, lowercase: letters, digits, `+`, `-` and
/// `.` only, the rule [`redact_url`] reads URLs by. Text before a `://` that
/// is not a scheme (`host=h password=a://b`) is no scheme: an error must
/// not show it.
fn scheme_of(url: &str) -> Option<String> {
    let end = url
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .unwrap_or(url.len());
    let (scheme, rest) = url.split_at(end);
    (!scheme.is_empty() && rest.starts_with("://")).then(|| scheme.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_and_errors() {
        assert!(connect("memory://").await.is_ok());
        for bad in ["nope", "ftp://x", ""] {
            assert!(
                matches!(connect(bad).await, Err(LockError::InvalidConfig { .. })),
                "{bad}"
            );
        }
    }

    /// `zks://` names the feature it needs when built without it, and shows
    /// no password either way.
    #[cfg(not(feature = "zookeeper-tls"))]
    #[tokio::test]
    async fn zks_without_its_feature_names_it() {
        let Err(e) = connect("zks://u:secret@127.0.0.1:2281?tls_ca=/ca.pem").await else {
            panic!("connected without TLS support");
        };
        let shown = format!("{e} {e:?}");
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{shown}");
        assert!(shown.contains("zookeeper-tls"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    /// `?auth=sasl` names the feature it needs when built without it, and
    /// shows no password.
    #[cfg(all(feature = "zookeeper", not(feature = "zookeeper-sasl")))]
    #[tokio::test]
    async fn zk_sasl_without_its_feature_names_it() {
        let Err(e) = connect("zk://u:secret@127.0.0.1:2181?auth=sasl").await else {
            panic!("connected without SASL support");
        };
        let shown = format!("{e} {e:?}");
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{shown}");
        assert!(shown.contains("zookeeper-sasl"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[tokio::test]
    async fn errors_show_no_part_of_a_password() {
        for url in [
            "host=h password=se:cret://x",
            "redis:/u:secret@h:1",
            "ftp://u:secret@h/",
            "secret",
        ] {
            let Err(e) = connect(url).await else {
                panic!("{url} connected");
            };
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("secret"), "{url}: {shown}");
        }
    }
}
