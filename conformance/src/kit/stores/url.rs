//! Store URLs: the address behind one, and the same URL pointed at a fault
//! proxy.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};

use super::Kind;

/// `(before, host:port, after)` of the first endpoint in a store URL.
pub(super) fn split_authority(kind: Kind, url: &str) -> (String, String, String) {
    match kind {
        Kind::ZooKeeper => {
            // host:port[,host:port...][/chroot]
            let (hosts, chroot) = match url.find('/') {
                Some(i) => (&url[..i], &url[i..]),
                None => (url, ""),
            };
            let first = hosts.split(',').next().unwrap_or("");
            (String::new(), first.to_owned(), chroot.to_owned())
        }
        _ => {
            // scheme://[userinfo@]host:port[/rest]; etcd: a comma-separated list
            let first = match kind {
                Kind::Etcd => url.split(',').next().unwrap_or(url),
                _ => url,
            };
            let (scheme, rest) = match first.find("://") {
                Some(i) => (&first[..i + 3], &first[i + 3..]),
                None => ("", first),
            };
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(end);
            let (userinfo, hostport) = match authority.rfind('@') {
                Some(i) => (&authority[..=i], &authority[i + 1..]),
                None => ("", authority),
            };
            (
                format!("{scheme}{userinfo}"),
                hostport.to_owned(),
                tail.to_owned(),
            )
        }
    }
}

pub(super) fn first_authority(kind: Kind, url: &str) -> String {
    let hostport = split_authority(kind, url).1;
    if hostport.contains(':') {
        hostport
    } else {
        let port = match kind {
            Kind::Redis => 6379,
            Kind::Postgres => 5432,
            Kind::Etcd => 2379,
            Kind::ZooKeeper => 2181,
        };
        format!("{hostport}:{port}")
    }
}

pub(super) fn replace_authority(kind: Kind, url: &str, addr: SocketAddr) -> String {
    let (before, _, after) = split_authority(kind, url);
    format!("{before}{addr}{after}")
}

pub(super) fn resolve(hostport: &str) -> io::Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = hostport.to_socket_addrs()?.collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "http://a:2379,http://b:2379",
                "http://127.0.0.1:9999",
            ),
            (
                Kind::ZooKeeper,
                "zk1:2181,zk2:2181/locks",
                "127.0.0.1:9999/locks",
            ),
        ];
        for (kind, url, want) in cases {
            assert_eq!(replace_authority(kind, url, via), want, "{kind}");
        }
        assert_eq!(
            first_authority(Kind::Redis, "redis://localhost"),
            "localhost:6379"
        );
        assert_eq!(
            first_authority(Kind::ZooKeeper, "zk1:2181,zk2:2181/x"),
            "zk1:2181"
        );
    }
}
