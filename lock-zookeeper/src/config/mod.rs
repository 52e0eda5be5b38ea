//! `ZooKeeperConfig`: where the ensemble is, where locks live, how long a
//! session (and so every lease) lasts.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lockcore::LockError;

/// How to reach ZooKeeper and where to keep locks.
///
/// Build it from a connect string with [`new`](Self::new) and the setters, or
/// parse a URL with [`from_url`](Self::from_url):
///
/// ```text
/// zk://[user:password@]host:port[,host:port...][/root][?session_timeout=30s&tick_time=2s&connection_timeout=4s&connect_timeout=10s]
/// ```
///
/// (`zookeeper://` works too; a plain connect string `host:port[,...][/chroot]`
/// is accepted as well.) The password may hold any character, even
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
    pub(crate) digest: Option<Digest>,
}

/// Digest credentials (`addauth digest user:password`).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl Digest {
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
            digest: None,
        }
    }

    /// Parses a `zk://` or `zookeeper://` URL, or a plain connect string.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what to fix.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            let lower = url.trim().to_ascii_lowercase();
            if lower.starts_with("zk:") || lower.starts_with("zookeeper:") {
                return Err(LockError::config(
                    "a ZooKeeper URL starts with zk:// or zookeeper:// (two slashes); the rest is not shown",
                ));
            }
            let config = ZooKeeperConfig::new(url.trim());
            config.validate()?;
            return Ok(config);
        };
        if !matches!(scheme.to_ascii_lowercase().as_str(), "zk" | "zookeeper") {
            let shown = match scheme_word(scheme) {
                true => format!("{scheme}://"),
                false => "this".to_owned(),
            };
            return Err(LockError::config(format!(
                "{shown} is not a ZooKeeper URL: expected zk:// or zookeeper://"
            )));
        }
        // The user info ends at the last `@` if no `/`, `?` or `#` comes
        // before the user name's `:` (else that `@` is in the path or the
        // query): a password may hold any of `#/?@:` unescaped.
        let userinfo_end = rest.rfind('@').filter(|&at| {
            let userinfo = &rest[..at];
            match (userinfo.find(['/', '?', '#']), userinfo.find(':')) {
                (Some(delimiter), Some(colon)) => colon < delimiter,
                (Some(_), None) => false,
                (None, _) => true,
            }
        });
        let (userinfo, rest) = match userinfo_end {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        if rest.contains('#') {
            return Err(LockError::config(
                "a ZooKeeper URL has no #fragment (write a # in the password as %23); the URL is not shown",
            ));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (hosts, root) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let mut config = ZooKeeperConfig::new(hosts);
        if let Some(root) = root.filter(|r| *r != "/" && !r.is_empty()) {
            config.root = decode(root, "root path")?;
        }
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').ok_or_else(|| {
                LockError::config("ZooKeeper credentials must be user:password (digest scheme)")
            })?;
            config.digest = Some(Digest {
                user: decode(user, "user")?,
                password: decode(password, "password")?,
            });
        }
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let setting = match key {
                "session_timeout" => &mut config.session_timeout,
                "connection_timeout" => config.connection_timeout.insert(Duration::ZERO),
                "connect_timeout" => &mut config.connect_timeout,
                "tick_time" => config.tick_time.insert(Duration::ZERO),
                other => {
                    // Shown only if it looks like an option's name.
                    let shown = match option_word(other) {
                        true => format!("{other:?}"),
                        false => "(not shown)".to_owned(),
                    };
                    return Err(LockError::config(format!(
                        "unknown ZooKeeper URL option {shown}; known: session_timeout, tick_time, connection_timeout, connect_timeout"
                    )));
                }
            };
            *setting = duration(key, &decode(value, key)?)?;
        }
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
        self.digest = Some(Digest {
            user: user.into(),
            password: password.into(),
        });
        self
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
        if self.connect_timeout.is_zero() {
            return Err(LockError::config(
                "ZooKeeper connect timeout must be positive",
            ));
        }
        if let Some(d) = &self.digest
            && (d.user.is_empty() || d.user.contains(':'))
        {
            return Err(LockError::config(
                "ZooKeeper digest user must be non-empty and contain no ':'",
            ));
        }
        Ok(())
    }
}

fn decode(s: &str, what: &str) -> Result<String, LockError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|e| LockError::config_caused_by(format!("ZooKeeper URL {what} is not UTF-8"), e))
}

/// The duration option `key` (a known option's name) set to `value`, which
/// an error does not show.
fn duration(key: &str, value: &str) -> Result<Duration, LockError> {
    humantime::parse_duration(value).map_err(|e| {
        LockError::config_caused_by(
            format!("ZooKeeper URL option {key} is not a duration like 30s or 500ms"),
            e,
        )
    })
}

/// Whether `scheme` is a URL scheme's word (safe to show).
fn scheme_word(scheme: &str) -> bool {
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Whether `key` looks like an option's name (lower-case words joined by
/// `_`): safe to show in an error, unlike a piece of a mistyped URL.
fn option_word(key: &str) -> bool {
    (1..=32).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// Whether `connect` reads as a connect string, `host[:port][,...][/chroot]`
/// (hosts may carry `tcp://` or `tcp+tls://`): no part of a URL's user
/// info can, so one that does is safe to show.
fn connect_string(connect: &str) -> bool {
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
                    && !crate::names::refused_by_zookeeper(c)
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
    let port_ok = port.is_empty() || (port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()));
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
        if part.chars().any(crate::names::refused_by_zookeeper) {
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
            .field("digest_user", &self.digest.as_ref().map(|d| &d.user))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
