//! Which store: its name, packages, variable, client URL and readiness probe.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::url::StoreUrl;
use super::{etcd, net, postgres};
use crate::kit::env;

/// Which store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// `redis-server`.
    Redis,
    /// PostgreSQL (`initdb` + `postgres`).
    Postgres,
    /// etcd v3.
    Etcd,
    /// Apache ZooKeeper.
    ZooKeeper,
}

impl Kind {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Redis => "redis",
            Kind::Postgres => "postgres",
            Kind::Etcd => "etcd",
            Kind::ZooKeeper => "zookeeper",
        }
    }

    /// The variable naming an external server to use instead of launching
    /// one (`LOCK_TEST_<STORE>_URL`), with its older name.
    pub fn url_var(self) -> env::Var {
        match self {
            Kind::Redis => env::REDIS_URL,
            Kind::Postgres => env::POSTGRES_URL,
            Kind::Etcd => env::ETCD_URL,
            Kind::ZooKeeper => env::ZOOKEEPER_URL,
        }
    }

    /// [`url_var`](Self::url_var)'s name.
    pub fn env_var(self) -> &'static str {
        self.url_var().name()
    }

    /// The external server's URL, if [`url_var`](Self::url_var) names one.
    pub fn external_url(self) -> Option<String> {
        self.url_var().get()
    }

    /// The URL schemes its adapter's `connect` (and `distlock::connect`)
    /// accept, plaintext first.
    pub fn schemes(self) -> &'static [&'static str] {
        match self {
            Kind::Redis => &["redis", "rediss"],
            Kind::Postgres => &["postgres", "postgresql"],
            Kind::Etcd => &["etcd", "etcds"],
            Kind::ZooKeeper => &["zk", "zookeeper", "zks"],
        }
    }

    /// The URL form, for error messages.
    pub fn url_form(self) -> &'static str {
        match self {
            Kind::Redis => "redis://[user[:password]@]host[:port][/db] (rediss:// for TLS)",
            Kind::Postgres => "postgres://user[:password]@host[:port]/database",
            Kind::Etcd => "etcd://host:port[,host:port...] (etcds:// for TLS)",
            Kind::ZooKeeper => {
                "zk://host:port[,host:port...][/root] (zks://...?tls_ca=PATH for TLS)"
            }
        }
    }

    /// The port a URL without one means.
    pub fn default_port(self) -> u16 {
        match self {
            Kind::Redis => 6379,
            Kind::Postgres => 5432,
            Kind::Etcd => 2379,
            Kind::ZooKeeper => 2181,
        }
    }

    /// The Debian packages that provide it.
    pub fn packages(self) -> &'static str {
        match self {
            Kind::Redis => "redis-server",
            Kind::Postgres => "postgresql",
            Kind::Etcd => "etcd-server etcd-client",
            Kind::ZooKeeper => "zookeeper",
        }
    }

    /// The URL clients connect to a launched server of this kind at `addr`
    /// with (plaintext): `redis://127.0.0.1:P`,
    /// `postgres://postgres@127.0.0.1:P/postgres`, `etcd://127.0.0.1:P`,
    /// `zk://127.0.0.1:P`.
    pub fn url_for(self, addr: SocketAddr) -> String {
        StoreUrl::local(self, addr, false).url()
    }

    /// One readiness probe over the store's own protocol: `Ok(true)` once it
    /// serves requests (not merely accepts connections).
    pub fn probe(self, addr: SocketAddr) -> io::Result<bool> {
        let timeout = Duration::from_millis(500);
        match self {
            Kind::Redis => {
                let reply = net::exchange(addr, b"PING\r\n", timeout, |r| r.ends_with(b"\r\n"))?;
                Ok(reply.starts_with(b"+PONG"))
            }
            Kind::Postgres => postgres::probe(addr, timeout),
            Kind::Etcd => etcd::probe(addr, timeout),
            // `ruok` answers before the server serves requests; `srvr` prints a
            // `Mode:` line only once it does.
            Kind::ZooKeeper => {
                let reply = net::exchange(addr, b"srvr", timeout, |_| false)?;
                Ok(super::zookeeper::serves(&reply))
            }
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a missing program or file, naming the package to install.
pub(crate) fn missing(kind: Kind, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{what} not found: install it with `apt-get install -y {}` (scripts/test-all.sh installs every store), \
             or point {} at a running server; {}=1 skips tests whose store is missing (never in CI)",
            kind.packages(),
            kind.env_var(),
            env::PARTIAL.name(),
        ),
    )
}

/// Finds `program` on PATH.
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_name_the_package_and_the_script() {
        let text = missing(Kind::Etcd, "etcd").to_string();
        assert!(
            text.contains("apt-get install -y etcd-server etcd-client"),
            "{text}"
        );
        assert!(
            text.contains("scripts/test-all.sh") && text.contains(env::PARTIAL.name()),
            "{text}"
        );
    }
}
