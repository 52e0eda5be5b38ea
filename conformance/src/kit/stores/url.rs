//! Store URLs, in the form `distlock::connect` and each adapter's `connect`
//! accept (`redis://`, `postgres://`, `etcd://host:port[,host:port]`,
//! `zk://host:port[,host:port][/root]`), taken apart: the address behind
//! one, the same URL pointed at a fault proxy, and the endpoint the store's
//! own client and CLI take (`http://host:port` for etcd, a connect string
//! for ZooKeeper).

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};

use super::Kind;

/// A store URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreUrl {
    kind: Kind,
    /// As given (`postgresql`, `zookeeper`... stay as they are).
    scheme: String,
    /// `user:password@`, or empty.
    userinfo: String,
    /// `host:port` each, the port filled in when left out.
    hosts: Vec<String>,
    /// `/db`, `/root`, `?query`..., or empty.
    tail: String,
}

impl StoreUrl {
    /// The URL of a server of `kind` the launcher started at `addr`.
    pub(crate) fn local(kind: Kind, addr: SocketAddr, tls: bool) -> StoreUrl {
        let (scheme, userinfo, tail) = match (kind, tls) {
            (Kind::Redis, false) => ("redis", "", ""),
            (Kind::Redis, true) => ("rediss", "", ""),
            (Kind::Postgres, _) => ("postgres", "postgres@", "/postgres"),
            (Kind::Etcd, false) => ("etcd", "", ""),
            (Kind::Etcd, true) => ("etcds", "", ""),
            (Kind::ZooKeeper, false) => ("zk", "", ""),
            (Kind::ZooKeeper, true) => ("zks", "", ""),
        };
        StoreUrl {
            kind,
            scheme: scheme.to_owned(),
            userinfo: userinfo.to_owned(),
            hosts: vec![addr.to_string()],
            tail: tail.to_owned(),
        }
    }

    /// Parses a URL of `kind`; the error says which form was expected.
    pub(crate) fn parse(kind: Kind, url: &str) -> Result<StoreUrl, String> {
        let expected = || format!("expected {}", kind.url_form());
        let (scheme, rest) = url.split_once("://").ok_or_else(expected)?;
        if !kind
            .schemes()
            .iter()
            .any(|s| s.eq_ignore_ascii_case(scheme))
        {
            return Err(format!("{scheme}:// is not a {kind} URL: {}", expected()));
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        let hosts: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|host| {
                // `host` or `[v6]`: no port given.
                if host.ends_with(']') || !host.contains(':') {
                    format!("{host}:{}", kind.default_port())
                } else {
                    host.to_owned()
                }
            })
            .collect();
        if hosts.is_empty() {
            return Err(format!("no host: {}", expected()));
        }
        Ok(StoreUrl {
            kind,
            scheme: scheme.to_owned(),
            userinfo: userinfo.to_owned(),
            hosts,
            tail: tail.to_owned(),
        })
    }

    /// The same URL with `query` (`?name=value...`) after its path.
    pub(crate) fn with_query(mut self, query: &str) -> StoreUrl {
        self.tail.push_str(query);
        self
    }

    /// The URL `connect` takes.
    pub(crate) fn url(&self) -> String {
        format!(
            "{}://{}{}{}",
            self.scheme,
            self.userinfo,
            self.hosts.join(","),
            self.tail
        )
    }

    /// What the store's own client and CLI take: the URL itself for Redis
    /// and PostgreSQL, `http(s)://host:port[,...]` for etcd, the connect
    /// string `host:port[,...][/root]` for ZooKeeper.
    pub(crate) fn endpoint(&self) -> String {
        match self.kind {
            Kind::Redis | Kind::Postgres => self.url(),
            Kind::Etcd => {
                let http = if self.scheme.eq_ignore_ascii_case("etcds") {
                    "https"
                } else {
                    "http"
                };
                let hosts: Vec<String> =
                    self.hosts.iter().map(|h| format!("{http}://{h}")).collect();
                hosts.join(",")
            }
            Kind::ZooKeeper => {
                let root = self.tail.split('?').next().unwrap_or_default();
                format!("{}{root}", self.hosts.join(","))
            }
        }
    }

    /// The same URL with every host replaced by `addr` (a fault proxy in
    /// front of the first one); credentials, database, root and query stay.
    pub(crate) fn via(&self, addr: SocketAddr) -> StoreUrl {
        StoreUrl {
            hosts: vec![addr.to_string()],
            ..self.clone()
        }
    }

    /// The first host's address (IPv4 preferred).
    pub(crate) fn first_addr(&self) -> io::Result<SocketAddr> {
        let addrs: Vec<SocketAddr> = self.hosts[0].to_socket_addrs()?.collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(kind: Kind, url: &str) -> StoreUrl {
        StoreUrl::parse(kind, url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn urls_keep_credentials_and_paths_when_proxied() {
        let via: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let cases = [
            (
                Kind::Redis,
                "redis://:pw@localhost:6380/2",
                "redis://:pw@127.0.0.1:9999/2",
            ),
            (
                Kind::Postgres,
                "postgres://u:p@db:5433/locks?sslmode=disable",
                "postgres://u:p@127.0.0.1:9999/locks?sslmode=disable",
            ),
            (
                Kind::Etcd,
                "etcd://u:p@a:2379,b:2379/app?timeout=2",
                "etcd://u:p@127.0.0.1:9999/app?timeout=2",
            ),
            (
                Kind::ZooKeeper,
                "zk://zk1:2181,zk2:2181/locks",
                "zk://127.0.0.1:9999/locks",
            ),
        ];
        for (kind, url, want) in cases {
            assert_eq!(parse(kind, url).via(via).url(), want, "{kind}");
        }
    }

    #[test]
    fn missing_ports_are_the_defaults() {
        let redis = parse(Kind::Redis, "redis://localhost");
        assert_eq!(redis.url(), "redis://localhost:6379");
        assert_eq!(
            parse(Kind::ZooKeeper, "zk://zk1,zk2:2182/x").url(),
            "zk://zk1:2181,zk2:2182/x"
        );
        assert_eq!(parse(Kind::Etcd, "etcd://[::1]").url(), "etcd://[::1]:2379");
        assert_eq!(
            parse(Kind::Postgres, "postgresql://u@db/x").url(),
            "postgresql://u@db:5432/x"
        );
    }

    #[test]
    fn endpoints_are_what_the_stores_own_clients_take() {
        assert_eq!(
            parse(Kind::Etcd, "etcd://a:1,b:2/prefix?timeout=3").endpoint(),
            "http://a:1,http://b:2"
        );
        assert_eq!(parse(Kind::Etcd, "etcds://a:1").endpoint(), "https://a:1");
        assert_eq!(
            parse(Kind::ZooKeeper, "zk://u:p@a:1,b:2/root?session_timeout=4s").endpoint(),
            "a:1,b:2/root"
        );
        let pg = "postgres://postgres@127.0.0.1:5432/postgres";
        assert_eq!(parse(Kind::Postgres, pg).endpoint(), pg);
    }

    #[test]
    fn launched_stores_get_urls_connect_accepts() {
        let addr: SocketAddr = "127.0.0.1:23456".parse().unwrap();
        let cases = [
            (Kind::Redis, false, "redis://127.0.0.1:23456"),
            (Kind::Redis, true, "rediss://127.0.0.1:23456"),
            (
                Kind::Postgres,
                false,
                "postgres://postgres@127.0.0.1:23456/postgres",
            ),
            (Kind::Etcd, false, "etcd://127.0.0.1:23456"),
            (Kind::Etcd, true, "etcds://127.0.0.1:23456"),
            (Kind::ZooKeeper, false, "zk://127.0.0.1:23456"),
        ];
        for (kind, tls, want) in cases {
            let url = StoreUrl::local(kind, addr, tls);
            assert_eq!(url.url(), want);
            assert_eq!(parse(kind, want), url, "{want} parses back");
            assert_eq!(url.first_addr().unwrap(), addr);
        }
    }

    #[test]
    fn other_forms_are_refused_saying_what_is_expected() {
        for (kind, url) in [
            (Kind::Etcd, "http://127.0.0.1:2379"),
            (Kind::ZooKeeper, "127.0.0.1:2181"),
            (Kind::Redis, "postgres://h:1/x"),
            (Kind::Postgres, "postgres://"),
        ] {
            let err = StoreUrl::parse(kind, url).unwrap_err();
            assert!(err.contains(kind.url_form()), "{url}: {err}");
        }
    }
}
