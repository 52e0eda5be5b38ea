//! A multi-member etcd cluster or ZooKeeper ensemble on loopback.

use std::io;
use std::time::Duration;

use super::{Kind, Store, etcd, zookeeper};
use crate::kit::poll::{self, TimedOut};

/// A multi-member etcd cluster or ZooKeeper ensemble on loopback.
#[derive(Debug)]
pub struct Cluster {
    /// The members, in member-id order.
    pub members: Vec<Store>,
}

impl Cluster {
    /// The cluster whose members `launches` start (one thread each, so they
    /// can find each other while starting), or every member's error.
    pub(crate) fn join(
        what: &str,
        launches: Vec<std::thread::JoinHandle<io::Result<Store>>>,
    ) -> io::Result<Cluster> {
        let mut members = Vec::new();
        let mut errors = Vec::new();
        for launch in launches {
            match launch.join() {
                Ok(Ok(store)) => members.push(store),
                Ok(Err(e)) => errors.push(e.to_string()),
                Err(_) => errors.push("launcher thread panicked".into()),
            }
        }
        if !errors.is_empty() {
            return Err(io::Error::other(format!(
                "{what} did not form: {}",
                errors.join("; ")
            )));
        }
        Ok(Cluster { members })
    }

    /// One URL naming every member, the form `connect` takes:
    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,...`, `zk://127.0.0.1:P1,...`.
    pub fn url(&self) -> String {
        let scheme = self.members.first().map_or("", |m| m.kind().schemes()[0]);
        let hosts: Vec<String> = self.members.iter().map(|m| m.addr().to_string()).collect();
        format!("{scheme}://{}", hosts.join(","))
    }

    /// Every member's endpoint for the store's own client
    /// ([`Store::endpoint`]): `http://127.0.0.1:P` (etcd), `127.0.0.1:P`
    /// (ZooKeeper).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Store::endpoint).collect()
    }

    /// The endpoints joined with commas: the ZooKeeper connect string, or
    /// `etcdctl --endpoints`.
    pub fn connect_string(&self) -> String {
        self.endpoints().join(",")
    }

    /// The index of the current leader, if a live member reports one.
    pub fn leader(&self) -> io::Result<usize> {
        let kind = self
            .members
            .first()
            .map(Store::kind)
            .ok_or_else(|| io::Error::other("empty cluster"))?;
        for (i, member) in self.members.iter().enumerate() {
            if !member.is_running() {
                continue;
            }
            let leads = match kind {
                Kind::Etcd => etcd::is_leader(member.addr()),
                Kind::ZooKeeper => zookeeper::is_leader(member.addr()),
                _ => Ok(false),
            };
            if leads.unwrap_or(false) {
                return Ok(i);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no live member reports itself leader",
        ))
    }

    /// Waits up to `within` for a leader among the live members.
    pub fn wait_leader(&self, within: Duration) -> io::Result<usize> {
        let mut last = None;
        poll::blocking(within, "a leader", || {
            Ok::<_, TimedOut>(match self.leader() {
                Ok(i) => Some(i),
                Err(e) => {
                    last = Some(e);
                    None
                }
            })
        })
        .map_err(|_| {
            let why = last.map_or_else(String::new, |e| format!(": {e}"));
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no leader within {within:?}{why}"),
            )
        })
    }

    /// `kill -9` of the current leader; returns its index.
    pub fn kill_leader(&self) -> io::Result<usize> {
        let leader = self.wait_leader(Duration::from_secs(10))?;
        self.members[leader].kill_now()?;
        Ok(leader)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A leader stopping cleanly while its peers are gone first tries to hand
        // over leadership (etcd: ~5 s); kill them all at once instead.
        for member in &self.members {
            let _ = member.kill_now();
        }
    }
}
