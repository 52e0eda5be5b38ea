//! `EtcdConfig`: endpoints, key prefix, credentials, TLS and timeouts, from a
//! builder or an `etcd://` URL ([`url`]: the URL and its options).

mod tls;
mod url;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{Clock, SystemClock, redact_url};

pub use tls::TlsConfig;

/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_BYTES: usize = 128;

/// How to reach etcd and where to keep the locks.
///
/// ```
/// use std::time::Duration;
/// use lock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::new(["http://127.0.0.1:2379"])
///     .prefix("billing/locks/")
///     .user("locker", "s3cret")
///     .request_timeout(Duration::from_secs(2));
/// assert!(!format!("{config:?}").contains("s3cret"));
///
/// let parsed = EtcdConfig::from_url("etcd://locker:s3cret@127.0.0.1:2379,127.0.0.1:2381/billing/locks/")?;
/// assert_eq!(parsed.endpoints(), ["http://127.0.0.1:2379", "http://127.0.0.1:2381"]);
/// assert_eq!(parsed.key_prefix(), "billing/locks/");
/// # Ok::<(), lockcore::LockError>(())
/// ```
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
    pub(crate) user: Option<(String, String)>,
    pub(crate) tls: Option<TlsConfig>,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) clock: Arc<dyn Clock>,
}

impl EtcdConfig {
    /// The default key prefix.
    pub const DEFAULT_PREFIX: &'static str = "distlock/";

    /// A config for these endpoints (`http://host:port`, `https://host:port`
    /// or `host:port`), prefix `distlock/`, no auth, no TLS, 5 s request
    /// timeout.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            user: None,
            tls: None,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            clock: Arc::new(SystemClock),
        }
    }

    /// Sets the key prefix under which every lock lives (default
    /// `distlock/`). Give each application its own prefix, and grant its etcd
    /// role read-write on exactly that prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Authenticates as `user` with `password` (etcd RBAC).
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Connects with TLS.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Gives up on any single request after this long (default 5 s); the
    /// request is then reported as [`LockError::Unavailable`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Gives up connecting to an endpoint after this long (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The endpoints, with their scheme.
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .map(|e| self.normalize(e))
            .collect::<Vec<_>>()
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    fn normalize(&self, endpoint: &str) -> String {
        let endpoint = endpoint.trim();
        if endpoint.contains("://") {
            endpoint.to_owned()
        } else if self.tls.is_some() {
            format!("https://{endpoint}")
        } else {
            format!("http://{endpoint}")
        }
    }

    /// Checks everything that can be checked without I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the field to fix.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.endpoints.is_empty() {
            return Err(LockError::config("at least one etcd endpoint is needed"));
        }
        for endpoint in self.endpoints() {
            // Said back redacted: one may carry a password it should not.
            let shown = redact_url(&endpoint);
            let (scheme, host) = endpoint.split_once("://").unwrap_or(("", ""));
            if !matches!(scheme, "http" | "https") {
                return Err(LockError::config(format!(
                    "endpoint {shown:?}: the scheme must be http or https"
                )));
            }
            if scheme == "http" && self.tls.is_some() {
                return Err(LockError::config(format!(
                    "endpoint {shown:?} is http:// but TLS is configured: use https://"
                )));
            }
            let valid_host = host.rsplit_once(':').is_some_and(|(h, port)| {
                !h.is_empty()
                    && !h.contains(['/', '@', '?', '#', ' '])
                    && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !valid_host {
                return Err(LockError::config(format!(
                    "endpoint {shown:?}: expected scheme://host:port (a user and password go in `user()`)"
                )));
            }
        }
        if self.prefix.is_empty() || self.prefix.len() > MAX_PREFIX_BYTES {
            return Err(LockError::config(format!(
                "the key prefix must be 1 to {MAX_PREFIX_BYTES} bytes, got {}",
                self.prefix.len()
            )));
        }
        if let Some(c) = self.prefix.chars().find(|c| c.is_control()) {
            return Err(LockError::config(format!(
                "the key prefix contains control character U+{:04X}",
                c as u32
            )));
        }
        if let Some((user, _)) = &self.user
            && user.is_empty()
        {
            return Err(LockError::config("the etcd user name is empty"));
        }
        for (what, d) in [
            ("request timeout", self.request_timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                return Err(LockError::config(format!(
                    "the {what} must be in (0, 1 h], got {d:?}"
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<String> = self.endpoints.iter().map(|e| redact_url(e)).collect();
        f.debug_struct("EtcdConfig")
            .field("endpoints", &endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("password", &self.user.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_builder_values() {
        let ok = EtcdConfig::new(["127.0.0.1:2379"]);
        assert!(ok.validate().is_ok());
        assert_eq!(ok.endpoints(), ["http://127.0.0.1:2379"]);
        let tls = ok.clone().tls(TlsConfig::new());
        assert_eq!(tls.endpoints(), ["https://127.0.0.1:2379"]);
        for bad in [
            EtcdConfig::new(Vec::<String>::new()),
            ok.clone().prefix(""),
            ok.clone().prefix("a\nb"),
            ok.clone().prefix("x".repeat(MAX_PREFIX_BYTES + 1)),
            ok.clone().request_timeout(Duration::ZERO),
            ok.clone().user("", "pw"),
            EtcdConfig::new(["ftp://h:1"]),
            EtcdConfig::new(["http://h:1"]).tls(TlsConfig::new()),
        ] {
            assert!(
                matches!(bad.validate(), Err(LockError::InvalidConfig { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn debug_hides_secrets() {
        let c = EtcdConfig::new(["h:1"]).user("alice", "hunter2").tls(
            TlsConfig::new()
                .ca_pem("CA-PEM")
                .identity_pem("CERT-PEM", "PRIVATE-KEY-PEM"),
        );
        let shown = format!("{c:?} {:#?}", c);
        assert!(shown.contains("alice"));
        for secret in ["hunter2", "PRIVATE-KEY-PEM", "CERT-PEM", "CA-PEM"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
    }
}
