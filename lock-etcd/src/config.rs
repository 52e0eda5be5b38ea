//! `EtcdConfig`: endpoints, key prefix, credentials, TLS and timeouts, from a
//! builder or an `etcd://` URL.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{Clock, SystemClock, redact_url};
use percent_encoding::percent_decode_str;

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

/// TLS settings: the CA that signed the servers' certificates, an optional
/// client identity (for `--client-cert-auth`) and the name to verify.
#[derive(Clone, Default)]
pub struct TlsConfig {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) domain: Option<String>,
}

impl TlsConfig {
    /// TLS verified against the platform's trust roots (webpki roots).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts only this CA certificate (PEM).
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents this client certificate and private key (both PEM).
    pub fn identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity_pem = Some((cert.into(), key.into()));
        self
    }

    /// Verifies the servers' certificates against this name instead of the
    /// endpoint's host.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key material.
        f.debug_struct("TlsConfig")
            .field("custom_ca", &self.ca_pem.is_some())
            .field("client_identity", &self.identity_pem.is_some())
            .field("domain", &self.domain)
            .finish()
    }
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

    /// Parses `etcd://[user[:password]@]host:port[,host:port...][/prefix][?options]`
    /// (`etcds://` for TLS). `user`, `password` and `prefix` are
    /// percent-decoded; an empty path keeps the default prefix. The user
    /// info runs to the last `@`, so a password may hold `/`, `?`, `#` or `@`
    /// unescaped; an `@` in the prefix must be written `%40`.
    ///
    /// Options: `ca=PATH` (PEM CA, implies TLS), `cert=PATH` and `key=PATH`
    /// (client identity), `domain=NAME`, `timeout=SECONDS`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] saying what is wrong (the password is
    /// never repeated in the message).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| LockError::config("an etcd URL starts with etcd:// or etcds://"))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(LockError::config(format!(
                    "scheme {other:?} is not etcd:// or etcds://"
                )));
            }
        };
        // The user info runs to the last `@` (a password may hold `/`, `?`,
        // `#`, `@` unescaped): the same rule `redact_url` hides it by.
        let (userinfo, rest) = match userinfo_end(rest) {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (hosts, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(LockError::config(
                "an etcd URL needs host:port endpoints separated by commas",
            ));
        }
        let http = if tls { "https" } else { "http" };
        let mut config = EtcdConfig::new(
            hosts
                .iter()
                .map(|h| format!("{http}://{h}"))
                .collect::<Vec<_>>(),
        );
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            config = config.user(decode(user, "user")?, decode(password, "password")?);
        }
        let prefix = path.strip_prefix('/').unwrap_or(path);
        if !prefix.is_empty() {
            config = config.prefix(decode(prefix, "prefix")?);
        }
        let mut tls_config = tls.then(TlsConfig::new);
        let (mut cert, mut key) = (None, None);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value, name)?;
            match name {
                "ca" => {
                    let pem = read(&value, "ca")?;
                    tls_config = Some(tls_config.unwrap_or_default().ca_pem(pem));
                }
                "cert" => cert = Some(read(&value, "cert")?),
                "key" => key = Some(read(&value, "key")?),
                "domain" => tls_config = Some(tls_config.unwrap_or_default().domain(value)),
                "timeout" => {
                    let secs: f64 = value
                        .parse()
                        .ok()
                        .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                        .ok_or_else(|| {
                            LockError::config(format!(
                                "timeout={value:?} is not a number of seconds in (0, 3600]"
                            ))
                        })?;
                    config = config.request_timeout(Duration::from_secs_f64(secs));
                }
                other => {
                    return Err(LockError::config(format!(
                        "unknown etcd URL option {other:?} (known: ca, cert, key, domain, timeout)"
                    )));
                }
            }
        }
        match (cert, key) {
            (Some(cert), Some(key)) => {
                tls_config = Some(tls_config.unwrap_or_default().identity_pem(cert, key));
            }
            (None, None) => {}
            _ => return Err(LockError::config("cert= and key= must be given together")),
        }
        if let Some(tls_config) = tls_config {
            config = config.tls(tls_config);
        }
        config.validate()?;
        Ok(config)
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

    /// For tests: reads every proof that a session is alive, and so stamps
    /// and judges every lease, on `clock` instead of the system clocks (a
    /// clock whose boot time jumps plays a host suspend). A lease counts
    /// from its session's last proof of life, which is older than the
    /// request, so it is judged on this clock, not on the `Locker`'s.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
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

/// Where the user info of the part after `scheme://` ends: at its last
/// `@`, unless a `/`, `?` or `#` comes before the user name's `:` (then that
/// `@` is in the path or query). As [`lockcore::backend::redact_url`] reads it.
fn userinfo_end(rest: &str) -> Option<usize> {
    rest.rfind('@').filter(|&at| {
        let userinfo = &rest[..at];
        match (userinfo.find(['/', '?', '#']), userinfo.find(':')) {
            (Some(delimiter), Some(colon)) => colon < delimiter,
            (Some(_), None) => false,
            (None, _) => true,
        }
    })
}

fn decode(text: &str, what: &str) -> Result<String, LockError> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|e| LockError::config_caused_by(format!("the {what} is not UTF-8"), e))
}

fn read(path: &str, what: &str) -> Result<Vec<u8>, LockError> {
    std::fs::read(Path::new(path))
        .map_err(|e| LockError::config_caused_by(format!("cannot read {what}={path}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints(), ["http://127.0.0.1:2379"]);
        assert_eq!(c.key_prefix(), "distlock/");
        assert!(c.user.is_none() && c.tls.is_none());

        let c = EtcdConfig::from_url("etcd://u%40x:p%3Aw@a:1,b:2/my%2Fapp/?timeout=1.5").unwrap();
        assert_eq!(c.endpoints(), ["http://a:1", "http://b:2"]);
        assert_eq!(c.key_prefix(), "my/app/");
        assert_eq!(c.user, Some(("u@x".into(), "p:w".into())));
        assert_eq!(c.request_timeout, Duration::from_millis(1500));

        // The option that bounded TTLs is gone: etcd's own maximum applies.
        assert!(EtcdConfig::from_url("etcd://h:1?max_ttl=3600").is_err());

        // A password with the characters URLs treat specially, unescaped:
        // the user info runs to the last `@`.
        let c = EtcdConfig::from_url("etcd://u:p#/?@:%x@a:1/app/?timeout=2").unwrap();
        assert_eq!(c.endpoints(), ["http://a:1"]);
        assert_eq!(c.user, Some(("u".into(), "p#/?@:%x".into())));
        assert_eq!(c.key_prefix(), "app/");
        assert_eq!(c.request_timeout, Duration::from_secs(2));
        // An `@` in the prefix is written `%40` (unescaped, everything up to
        // it reads as user info, as `redact_url` hides it).
        let c = EtcdConfig::from_url("etcd://a:1/x%40y/").unwrap();
        assert!(c.user.is_none());
        assert_eq!(c.key_prefix(), "x@y/");
        assert!(EtcdConfig::from_url("etcd://a:1/x@y/").is_err());

        let c = EtcdConfig::from_url("etcds://h:2379?domain=etcd.local").unwrap();
        assert_eq!(c.endpoints(), ["https://h:2379"]);
        assert_eq!(c.tls.unwrap().domain.as_deref(), Some("etcd.local"));
    }

    #[test]
    fn rejects_bad_urls_without_echoing_secrets() {
        for bad in [
            "redis://h:1",
            "etcd://",
            "etcd://h:1,,h:2",
            "etcd://h",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h:1?nope=1",
            "etcd://h:1?timeout=-1",
            "etcd://h:1?cert=/nonexistent",
            "etcd://u:topsecret@h:1?timeout=x",
            "etcd://h:1/%FF",
            "no-scheme",
        ] {
            let err = EtcdConfig::from_url(bad).unwrap_err();
            assert!(
                matches!(err, LockError::InvalidConfig { .. }),
                "{bad}: {err:?}"
            );
            assert!(!err.to_string().contains("topsecret"), "{err}");
        }
    }

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
