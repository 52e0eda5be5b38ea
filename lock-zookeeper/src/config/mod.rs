//! `ZooKeeperConfig`: where the ensemble is, where locks live, how long a
//! session (and so every lease) lasts.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::StoreUrl;

#[cfg(feature = "tls")]
mod tls;
mod url;

#[cfg(feature = "tls")]
pub(crate) use tls::install_provider;

/// The schemes of a ZooKeeper URL (`zks` speaks TLS to every server).
const SCHEMES: &[&str] = &["zk", "zookeeper", "zks"];

/// How to reach ZooKeeper and where to keep locks.
///
/// Build it from a connect string with [`new`](Self::new) and the setters, or
/// parse a URL with [`from_url`](Self::from_url):
///
/// ```text
/// zk://[user:password@]host:port[,host:port...][/root][?session_timeout=30s&tick_time=2s&container_check_interval=1m&connection_timeout=4s&connect_timeout=10s&password_file=PATH&auth=digest|sasl]
/// zks://[user:password@]host:port[,host:port...][/root]?tls_ca=PATH[&tls_cert=PATH&tls_key=PATH][&...]
/// ```
///
/// (`zookeeper://` works too; a plain connect string `host:port[,...][/chroot]`
/// is accepted as well.) `zks://` (the `tls` feature) speaks TLS to every
/// server, each server's certificate checked against the CA in `tls_ca` and
/// for the host the URL names; `tls_cert` and `tls_key` name a client
/// certificate and its key, for servers with `ssl.clientAuth=need`.
///
/// Credentials authenticate with ZooKeeper's digest scheme (`addauth
/// digest`), or with `auth=sasl` (the `sasl` feature) by SASL DIGEST-MD5
/// against a server's JAAS `Server` section. The password may hold any character, even
/// unescaped `#/?@:` (the user info ends at the last `@`, as
/// [`redact_url`](lockcore::backend::redact_url) reads it); percent-escapes
/// are decoded. `Debug` and errors never show it.
#[derive(Clone)]
#[non_exhaustive]
pub struct ZooKeeperConfig {
    pub(crate) connect: String,
    pub(crate) root: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connection_timeout: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    pub(crate) tick_time: Option<Duration>,
    pub(crate) container_check_interval: Duration,
    pub(crate) credentials: Option<Credentials>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<tls::Tls>,
}

/// A user and password, and how they authenticate.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
    pub(crate) scheme: Scheme,
}

/// How credentials authenticate (the URL's `auth=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// `addauth digest user:password`: every server takes it; a wrong
    /// password is another identity, which ACLs keep out.
    Digest,
    /// SASL DIGEST-MD5 (`SASLAuthenticationProvider`, users in the
    /// servers' JAAS file): a wrong password is refused at connect.
    #[cfg(feature = "sasl")]
    Sasl,
}

impl Scheme {
    /// The word of the URL's `auth=` option.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Scheme::Digest => "digest",
            #[cfg(feature = "sasl")]
            Scheme::Sasl => "sasl",
        }
    }
}

impl Credentials {
    /// What ZooKeeper's digest scheme takes.
    pub(crate) fn auth(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

impl ZooKeeperConfig {
    /// The default lock root.
    pub const DEFAULT_ROOT: &'static str = "/distlock";
    /// The default session timeout asked of the server (it may clamp it):
    /// 30 s, the `Locker`'s default TTL, and inside ZooKeeper's default
    /// `maxSessionTimeout` (20 ticks of 2 s).
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);
    /// The servers' default `znode.container.checkIntervalMs`: 60 s.
    pub const DEFAULT_CONTAINER_CHECK_INTERVAL: Duration = Duration::from_secs(60);
    /// The options a `zk://` URL takes (see the crate documentation's table).
    pub const URL_OPTIONS: &'static [&'static str] = &[
        "session_timeout",
        "tick_time",
        "container_check_interval",
        "connection_timeout",
        "connect_timeout",
        "password_file",
        "auth",
        "tls_ca",
        "tls_cert",
        "tls_key",
    ];

    /// A configuration for the ensemble at `connect` (`host:port[,host:port...][/chroot]`),
    /// locks under [`DEFAULT_ROOT`](Self::DEFAULT_ROOT), a 30 s session, no credentials.
    pub fn new(connect: impl Into<String>) -> Self {
        ZooKeeperConfig {
            connect: connect.into(),
            root: Self::DEFAULT_ROOT.to_owned(),
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
            connection_timeout: None,
            connect_timeout: Duration::from_secs(10),
            tick_time: None,
            container_check_interval: Self::DEFAULT_CONTAINER_CHECK_INTERVAL,
            credentials: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Parses a `zk://`, `zookeeper://` or `zks://` URL, or a plain connect string.
    ///
    /// The URL is read by [`StoreUrl`], with the options of
    /// [`URL_OPTIONS`](Self::URL_OPTIONS) (durations as `30s`, `250ms`,
    /// `1m`). The user info ends at the last `@` (as
    /// [`redact_url`](lockcore::backend::redact_url) reads it), so a password
    /// may hold `#/?@:` unescaped.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what to fix; it shows no part of
    /// a password, and a part of the URL only where it cannot hold one.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            let lower = url.trim().to_ascii_lowercase();
            if ["zk:", "zks:", "zookeeper:"]
                .iter()
                .any(|s| lower.starts_with(s))
            {
                return Err(LockError::config(
                    "a ZooKeeper URL starts with zk://, zookeeper:// or zks:// (two slashes); the rest is not shown",
                ));
            }
            let config = ZooKeeperConfig::new(url.trim());
            config.validate()?;
            return Ok(config);
        };
        let mut parsed = StoreUrl::parse(&url::normalized(scheme, rest)?, SCHEMES)
            .map_err(|_| url::unparsable())?;
        let hosts = parsed.hosts().iter().map(url::host).collect::<Vec<_>>();
        let mut config = ZooKeeperConfig::new(hosts.join(","));
        if !matches!(parsed.path(), "" | "/") {
            config.root = parsed.path().to_owned();
        }
        let user = parsed.user().map(str::to_owned);
        let scheme = url::auth_scheme(&mut parsed)?;
        config.credentials = match (user, parsed.take_password()?) {
            (None, None) => None,
            (Some(user), Some(password)) => Some(Credentials {
                user,
                password,
                scheme: scheme.unwrap_or(Scheme::Digest),
            }),
            _ => {
                return Err(LockError::config(
                    "ZooKeeper credentials must be user:password, or a user and password_file",
                ));
            }
        };
        if config.credentials.is_none() && scheme.is_some() {
            return Err(LockError::config(
                "URL option auth= needs credentials: zk://user:password@host (or a user and password_file)",
            ));
        }
        for (name, setting) in [
            ("session_timeout", &mut config.session_timeout),
            ("connect_timeout", &mut config.connect_timeout),
            (
                "container_check_interval",
                &mut config.container_check_interval,
            ),
        ] {
            if let Some(value) = url::take_duration(&mut parsed, name)? {
                *setting = value;
            }
        }
        config.connection_timeout = url::take_duration(&mut parsed, "connection_timeout")?;
        config.tick_time = url::take_duration(&mut parsed, "tick_time")?;
        config = url::certificates(&mut parsed, config)?;
        parsed.finish(Self::URL_OPTIONS)?;
        config.validate()?;
        Ok(config)
    }

    /// Sets the root under which every lock gets one child (default `/distlock`).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Sets the session timeout to ask for. The server clamps it to its
    /// `[minSessionTimeout, maxSessionTimeout]` (by default 2 to 20 ticks);
    /// the negotiated value is every lease's TTL.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets the servers' `tickTime` (default: the largest ZooKeeper's
    /// defaults allow for the session granted, `min(2 s, session timeout / 2)`:
    /// the default `tickTime` is 2 s and the default `minSessionTimeout` two
    /// ticks).
    ///
    /// Servers expire sessions in tick-sized steps and pass a follower's news
    /// of a session to the leader every half tick, so the tick sizes both the
    /// margin taken off every lease's deadline and the declared expiry slack
    /// (see the crate documentation). Setting it to the real value tightens
    /// both; setting it lower than the real value makes leases end later
    /// than the servers may expire them.
    pub fn tick_time(mut self, tick: Duration) -> Self {
        self.tick_time = Some(tick);
        self
    }

    /// Sets the servers' `znode.container.checkIntervalMs` (default 60 s,
    /// the servers' default): how often the leader deletes expired TTL
    /// nodes. A lease kept by `set_remaining` is a TTL node, freed at the
    /// first of these sweeps after its time ran out, so up to this late:
    /// it is part of the declared expiry slack
    /// ([`Capabilities::expiry_slack`](lockcore::Capabilities::expiry_slack))
    /// where the servers keep TTL nodes. Setting it below the real value
    /// makes the slack too small.
    pub fn container_check_interval(mut self, interval: Duration) -> Self {
        self.container_check_interval = interval;
        self
    }

    /// The servers' tick for a session of `timeout`: the configured one, or
    /// the largest ZooKeeper's defaults allow.
    pub(crate) fn tick_for(&self, timeout: Duration) -> Duration {
        self.tick_time
            .unwrap_or_else(|| (timeout / 2).min(Duration::from_secs(2)))
    }

    /// Sets how long a connection may stay silent before the client tries
    /// another server (default: 2/5 of the session timeout).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = Some(timeout);
        self
    }

    /// Sets how long establishing a session may take (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Authenticates with the digest scheme and creates lock nodes readable
    /// and deletable only by this identity (`auth` ACL).
    pub fn digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: user.into(),
            password: password.into(),
            scheme: Scheme::Digest,
        });
        self
    }

    /// Authenticates with SASL DIGEST-MD5 (a user of the servers' JAAS
    /// `Server` section, `SASLAuthenticationProvider`), and creates lock
    /// nodes readable and deletable only by this identity (`auth` ACL). A
    /// wrong password is refused at connect. The URL form is
    /// `zk://user:password@host:port?auth=sasl`.
    #[cfg(feature = "sasl")]
    pub fn sasl(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: user.into(),
            password: password.into(),
            scheme: Scheme::Sasl,
        });
        self
    }

    /// How the credentials authenticate: `Some("digest")` or
    /// `Some("sasl")`; `None` without credentials.
    pub fn auth_scheme(&self) -> Option<&'static str> {
        self.credentials.as_ref().map(|c| c.scheme.word())
    }

    /// Speaks TLS to every server and trusts only the CA certificates in
    /// `pem` (ZooKeeper's client has no system roots): each server must
    /// present a certificate that chains to one of them and is issued for
    /// the host the connect string names. The URL form is
    /// `zks://host:port?tls_ca=/path/to/ca.pem`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when `pem` holds no well-formed CA
    /// certificate.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert_pem(mut self, pem: impl AsRef<[u8]>) -> Result<Self, LockError> {
        self.tls = Some(tls::Tls::with_ca(self.tls.take(), pem.as_ref())?);
        Ok(self)
    }

    /// Presents this client certificate (PEM, leaf first) and its private
    /// key (PEM: PKCS#8, PKCS#1 or SEC1), for servers with
    /// `ssl.clientAuth=need`. Set the CA first
    /// ([`tls_root_cert_pem`](Self::tls_root_cert_pem)). The URL form is
    /// `?tls_cert=/path/to/client.pem&tls_key=/path/to/client.key`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for malformed PEM, a key that does not
    /// belong to the certificate, or no CA set yet. The message never
    /// contains the key.
    #[cfg(feature = "tls")]
    pub fn tls_client_identity_pem(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, LockError> {
        let Some(tls) = &self.tls else {
            return Err(LockError::config(
                "a client certificate needs TLS: set the CA the servers' certificates chain to first (tls_root_cert_pem, or tls_ca= in a zks:// URL)",
            ));
        };
        self.tls = Some(tls.with_identity(cert_pem.as_ref(), key_pem.as_ref())?);
        Ok(self)
    }

    /// Whether the client speaks TLS to the servers (`zks://`).
    pub fn uses_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The connect string.
    pub fn connect_string(&self) -> &str {
        &self.connect
    }

    /// The lock root.
    pub fn root_path(&self) -> &str {
        &self.root
    }

    /// The session timeout asked for.
    pub fn requested_session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what to fix.
    pub fn validate(&self) -> Result<(), LockError> {
        if !connect_string(&self.connect) {
            // Not shown: what is no connect string may be part of a URL.
            return Err(LockError::config(
                "ZooKeeper connect string must be host:port[,host:port...][/chroot] (the one given is not shown)",
            ));
        }
        validate_root(&self.root)?;
        let max = Duration::from_millis(i32::MAX as u64);
        if self.session_timeout.is_zero() || self.session_timeout > max {
            return Err(LockError::config(format!(
                "ZooKeeper session timeout {:?} must be between 1 ms and {max:?}",
                self.session_timeout
            )));
        }
        if let Some(t) = self.connection_timeout
            && (t.is_zero() || t > max)
        {
            return Err(LockError::config(format!(
                "ZooKeeper connection timeout {t:?} must be between 1 ms and {max:?}"
            )));
        }
        if let Some(t) = self.tick_time
            && (t.is_zero() || t > max)
        {
            return Err(LockError::config(format!(
                "ZooKeeper tick time {t:?} must be between 1 ms and {max:?}"
            )));
        }
        if self.container_check_interval.is_zero() || self.container_check_interval > max {
            return Err(LockError::config(format!(
                "ZooKeeper container check interval {:?} must be between 1 ms and {max:?}",
                self.container_check_interval
            )));
        }
        if self.connect_timeout.is_zero() {
            return Err(LockError::config(
                "ZooKeeper connect timeout must be positive",
            ));
        }
        if let Some(c) = &self.credentials {
            match c.scheme {
                Scheme::Digest if c.user.is_empty() || c.user.contains(':') => {
                    return Err(LockError::config(
                        "ZooKeeper digest user must be non-empty and contain no ':'",
                    ));
                }
                #[cfg(feature = "sasl")]
                Scheme::Sasl if c.user.is_empty() => {
                    return Err(LockError::config("ZooKeeper SASL user must be non-empty"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Whether `connect` reads as a connect string, `host[:port][,...][/chroot]`
/// (hosts may carry `tcp://` or `tcp+tls://`): no part of a URL's user
/// info can, so one that does is safe to show.
pub(super) fn connect_string(connect: &str) -> bool {
    let entries: Vec<&str> = connect.split(',').collect();
    let last = entries.len() - 1;
    entries.iter().enumerate().all(|(i, entry)| {
        let entry = (entry.strip_prefix("tcp://"))
            .or_else(|| entry.strip_prefix("tcp+tls://"))
            .unwrap_or(entry);
        let (address, chroot) = match entry.find('/') {
            Some(at) if i == last => entry.split_at(at),
            Some(_) => return false,
            None => (entry, ""),
        };
        address_word(address)
            && chroot.chars().all(|c| {
                !c.is_whitespace()
                    && !matches!(c, '@' | '?' | '#')
                    && !crate::keys::names::refused_by_zookeeper(c)
            })
    })
}

/// Whether `address` is `host[:port]` or `[v6][:port]`.
fn address_word(address: &str) -> bool {
    let (host, port) = match address.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((host, "")) => (host, ""),
            Some((host, rest)) if rest.starts_with(':') => (host, &rest[1..]),
            _ => return false,
        },
        None => match address.rsplit_once(':') {
            Some((host, port)) => (host, port),
            None => (address, ""),
        },
    };
    let host_ok = !host.is_empty()
        && host.chars().all(|c| match address.starts_with('[') {
            true => c.is_ascii_hexdigit() || matches!(c, ':' | '.'),
            false => c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'),
        });
    let port_ok = port.is_empty()
        || (port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok());
    host_ok && port_ok
}

/// A root is an absolute path of valid segments, not `/` itself and not
/// inside ZooKeeper's reserved `/zookeeper` tree.
fn validate_root(root: &str) -> Result<(), LockError> {
    let bad = |why: &str| {
        Err(LockError::config(format!(
            "ZooKeeper lock root {root:?} {why}; use an absolute path like /distlock"
        )))
    };
    let Some(rest) = root.strip_prefix('/') else {
        return bad("must start with /");
    };
    if rest.is_empty() {
        return bad("must not be / itself");
    }
    if rest == "zookeeper" || rest.starts_with("zookeeper/") {
        return bad("is inside ZooKeeper's reserved /zookeeper tree");
    }
    for part in rest.split('/') {
        if part.is_empty() {
            return bad("has an empty segment (// or a trailing /)");
        }
        if part == "." || part == ".." {
            return bad("has a relative segment");
        }
        if part.chars().any(crate::keys::names::refused_by_zookeeper) {
            return bad("has a character ZooKeeper refuses in paths");
        }
    }
    Ok(())
}

impl FromStr for ZooKeeperConfig {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ZooKeeperConfig::from_url(s)
    }
}

impl fmt::Debug for ZooKeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let connect = match connect_string(&self.connect) {
            true => self.connect.clone(),
            false => lockcore::backend::redact_url(&self.connect),
        };
        f.debug_struct("ZooKeeperConfig")
            .field("connect", &connect)
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("tick_time", &self.tick_time)
            .field("container_check_interval", &self.container_check_interval)
            .field("user", &self.credentials.as_ref().map(|c| &c.user))
            .field("auth", &self.auth_scheme())
            .field("tls", &self.uses_tls())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
