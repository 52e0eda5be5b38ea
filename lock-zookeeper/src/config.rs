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
/// is accepted as well.) `Debug` never shows the password.
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
            let config = ZooKeeperConfig::new(url.trim());
            config.validate()?;
            return Ok(config);
        };
        if !matches!(scheme.to_ascii_lowercase().as_str(), "zk" | "zookeeper") {
            return Err(LockError::config(format!(
                "{scheme}:// is not a ZooKeeper URL: expected zk:// or zookeeper://"
            )));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, root) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
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
            let value = decode(value, key)?;
            match key {
                "session_timeout" => config.session_timeout = duration(key, &value)?,
                "connection_timeout" => config.connection_timeout = Some(duration(key, &value)?),
                "connect_timeout" => config.connect_timeout = duration(key, &value)?,
                "tick_time" => config.tick_time = Some(duration(key, &value)?),
                other => {
                    return Err(LockError::config(format!(
                        "unknown ZooKeeper URL option {other:?}; known: session_timeout, tick_time, connection_timeout, connect_timeout"
                    )));
                }
            }
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
        if self.connect.is_empty() || self.connect.starts_with('/') || self.connect.contains(' ') {
            return Err(LockError::config(format!(
                "ZooKeeper connect string {:?} must be host:port[,host:port...][/chroot]",
                self.connect
            )));
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

fn duration(key: &str, value: &str) -> Result<Duration, LockError> {
    humantime::parse_duration(value).map_err(|e| {
        LockError::config_caused_by(
            format!("ZooKeeper URL option {key}={value:?} is not a duration like 30s or 500ms"),
            e,
        )
    })
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
        f.debug_struct("ZooKeeperConfig")
            .field("connect", &self.connect)
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
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_connect_strings() {
        let c: ZooKeeperConfig =
            "zk://alice:s%40cret@zk1:2181,zk2:2181/apps/locks?session_timeout=10s&connection_timeout=2s&tick_time=250ms"
                .parse()
                .unwrap();
        assert_eq!(c.tick_time, Some(Duration::from_millis(250)));
        assert_eq!(c.connect, "zk1:2181,zk2:2181");
        assert_eq!(c.root, "/apps/locks");
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(c.connection_timeout, Some(Duration::from_secs(2)));
        let d = c.digest.as_ref().unwrap();
        assert_eq!((d.user.as_str(), d.password.as_str()), ("alice", "s@cret"));

        let plain = ZooKeeperConfig::from_url("127.0.0.1:2181/chroot").unwrap();
        assert_eq!(plain.connect, "127.0.0.1:2181/chroot");
        assert_eq!(plain.root, ZooKeeperConfig::DEFAULT_ROOT);
        let bare = ZooKeeperConfig::from_url("zookeeper://h:1").unwrap();
        assert_eq!(bare.root, ZooKeeperConfig::DEFAULT_ROOT);
    }

    #[test]
    fn rejects_bad_values_with_a_reason() {
        for (url, why) in [
            ("redis://h:1", "not a ZooKeeper URL"),
            ("zk://h:1/", ""),
            ("zk://h:1/a//b", "empty segment"),
            ("zk://h:1/a/../b", "relative"),
            ("zk://h:1/zookeeper/x", "reserved"),
            ("zk://h:1/a?session_timeout=forever", "not a duration"),
            ("zk://h:1/a?session_timeout=0s", "session timeout"),
            ("zk://h:1/a?tick_time=0s", "tick time"),
            ("zk://h:1/a?ttl=3s", "unknown"),
            ("zk://nocolon@h:1/a", "user:password"),
            ("zk:///a", "connect string"),
        ] {
            match ZooKeeperConfig::from_url(url) {
                Err(e @ LockError::InvalidConfig { .. }) => {
                    assert!(e.to_string().contains(why), "{url}: {e}")
                }
                other if why.is_empty() => assert!(other.is_ok(), "{url}: {other:?}"),
                other => panic!("{url}: expected InvalidConfig, got {other:?}"),
            }
        }
        assert!(
            ZooKeeperConfig::new("h:1")
                .root("relative")
                .validate()
                .is_err()
        );
        assert!(ZooKeeperConfig::new("h:1").root("/").validate().is_err());
    }

    #[test]
    fn debug_hides_the_password() {
        let c = ZooKeeperConfig::new("h:1").digest("alice", "hunter2");
        let shown = format!("{c:?}");
        assert!(
            shown.contains("alice") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
