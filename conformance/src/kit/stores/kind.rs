//! Which store: its name, packages, variable, client URL and readiness probe.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{etcd, net, postgres};

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

    /// The variable naming an external server to use instead of launching one.
    pub fn env_var(self) -> &'static str {
        match self {
            Kind::Redis => "LOCK_TEST_REDIS_URL",
            Kind::Postgres => "LOCK_TEST_POSTGRES_URL",
            Kind::Etcd => "LOCK_TEST_ETCD_ENDPOINTS",
            Kind::ZooKeeper => "LOCK_TEST_ZOOKEEPER",
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

    /// The URL clients use to reach a server of this kind at `addr`.
    pub fn url_for(self, addr: SocketAddr) -> String {
        match self {
            Kind::Redis => format!("redis://{addr}"),
            Kind::Postgres => format!("postgres://postgres@{addr}/postgres"),
            Kind::Etcd => format!("http://{addr}"),
            Kind::ZooKeeper => addr.to_string(),
        }
    }

    /// One readiness probe over the store's own protocol: `Ok(true)` once it
    /// serves requests (not merely accepts connections).
    pub fn probe(self, addr: SocketAddr) -> io::Result<bool> {
        let timeout = Duration::from_millis(500);
        match self {
            Kind::Redis => {
                let reply =
                    net::exchange(addr, b"PING\r\n", timeout, |r| r.ends_with(b"\r\n"))?;
                Ok(reply.starts_with(b"+PONG"))
            }
            Kind::Postgres => postgres::probe(addr, timeout),
            Kind::Etcd => etcd::probe(addr, timeout),
            // `ruok` answers before the server serves requests; `srvr` prints a
            // `Mode:` line only once it does.
            Kind::ZooKeeper => {
                let reply = net::exchange(addr, b"srvr", timeout, |_| false)?;
                Ok(String::from_utf8_lossy(&reply).contains("Mode: "))
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
             or point {} at a running server; LOCK_TEST_PARTIAL=1 skips tests whose store is missing (never in CI)",
            kind.packages(),
            kind.env_var()
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
            text.contains("scripts/test-all.sh") && text.contains("LOCK_TEST_PARTIAL"),
            "{text}"
        );
    }
}
