//! What the fault cases may do to a store process.

use std::io;
use std::net::SocketAddr;

use async_trait::async_trait;

/// A store process the suite may hurt: kill, pause, restart.
#[async_trait]
pub trait StoreControl: Send + Sync {
    /// Where clients reach it.
    fn addr(&self) -> SocketAddr;

    /// Every server a client reaches, [`addr`](Self::addr) first: more than
    /// one for a store whose clients talk to each of its servers (a Redis
    /// Cluster's nodes). The fault cases put a proxy in front of each.
    fn addrs(&self) -> Vec<SocketAddr> {
        vec![self.addr()]
    }

    /// Whether a `kill -9` + restart keeps the store's data (its durability
    /// settings are the ones the backend's docs recommend).
    fn durable(&self) -> bool;

    /// `Some(why)` when the suite did not start this server (one named by a
    /// `LOCK_TEST_*` variable): kill, pause and restart then fail, and the
    /// cases that need them skip with `why`.
    fn external(&self) -> Option<String> {
        None
    }

    /// `kill -9`.
    async fn kill(&self) -> io::Result<()>;

    /// Starts it again on the same data directory and port, and waits until it serves.
    async fn restart(&self) -> io::Result<()>;

    /// `SIGSTOP`.
    async fn pause(&self) -> io::Result<()>;

    /// `SIGCONT`.
    async fn resume(&self) -> io::Result<()>;

    /// Sets the store's wall clock to real time + `offset_secs` (negative:
    /// behind). Only stores started under libfaketime support it (PostgreSQL
    /// here); the default says so.
    async fn step_clock(&self, offset_secs: i64) -> io::Result<()> {
        let _ = offset_secs;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this store's clock cannot be stepped (libfaketime works for PostgreSQL only: it hangs redis-server, Go ignores it)",
        ))
    }
}
