//! What a Redis restart keeps, and so what fencing survives it.

use std::fmt;

use redis::aio::ConnectionManager;

/// The assumption under which fencing tokens stay monotonic across a Redis
/// restart (what [`Capabilities::fence_durability`](lockcore::Capabilities)
/// reports).
pub const FENCE_ASSUMPTION: &str = "fences survive any restart with `appendonly yes` + `appendfsync always`; \
with `everysec`, RDB snapshots or no persistence, a lost or rolled-back counter restarts at the \
server's clock in microseconds, so fences still grow unless the Redis host's clock stepped back \
across the restart";

/// The server's persistence settings, read at connect with `CONFIG GET`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Persistence {
    /// AOF with an fsync per write: the fence counter survives a crash of
    /// the process or the machine.
    AofAlways,
    /// AOF fsynced once a second: a process crash loses nothing (the page
    /// cache survives); a power loss or kernel crash loses up to a second.
    AofEverysec,
    /// AOF left to the OS to flush: a machine crash can lose more.
    AofNo,
    /// RDB snapshots only: a crash loses everything since the last snapshot.
    Snapshots,
    /// No persistence: a restart forgets every lock and counter.
    None,
    /// The settings could not be read (`CONFIG` renamed or denied by ACL).
    Unknown(String),
}

impl Persistence {
    /// Whether the fence counter survives a crash of the Redis machine
    /// without relying on its clock.
    pub fn is_durable(&self) -> bool {
        matches!(self, Persistence::AofAlways)
    }

    pub(crate) async fn probe(con: &mut ConnectionManager) -> Persistence {
        let reply: Result<(Vec<String>, Vec<String>, Vec<String>), _> = redis::pipe()
            .cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .query_async(con)
            .await;
        let (aof, fsync, save) = match reply {
            Ok(r) => r,
            Err(e) => return Persistence::Unknown(e.to_string()),
        };
        let value = |pair: &[String]| pair.get(1).cloned().unwrap_or_default();
        match (value(&aof).as_str(), value(&fsync).as_str()) {
            ("yes", "always") => Persistence::AofAlways,
            ("yes", "everysec") => Persistence::AofEverysec,
            ("yes", _) => Persistence::AofNo,
            ("no", _) if !value(&save).trim().is_empty() => Persistence::Snapshots,
            ("no", _) => Persistence::None,
            (other, _) => Persistence::Unknown(format!("appendonly = {other:?}")),
        }
    }
}

impl fmt::Display for Persistence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Persistence::AofAlways => f.write_str("AOF, appendfsync always"),
            Persistence::AofEverysec => f.write_str("AOF, appendfsync everysec"),
            Persistence::AofNo => f.write_str("AOF, appendfsync no"),
            Persistence::Snapshots => f.write_str("RDB snapshots only"),
            Persistence::None => f.write_str("no persistence"),
            Persistence::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}
