//! Redis: `redis-server` in the foreground, persistence configurable.

use std::io;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::{Kind, Launch, SharedSlot, Spec, Store, process};

/// What survives a `kill -9`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// Nothing (`--save '' --appendonly no`): every key and counter is lost
    /// on restart. Documents the limit (T3.6b), never a default.
    None,
    /// AOF with `appendfsync always`: every write is on disk before the reply.
    #[default]
    AofAlways,
    /// AOF with `appendfsync everysec` (a `kill -9` keeps the page cache, so
    /// only a power loss shows its one-second window).
    AofEverysec,
}

/// Launch options.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Options {
    /// Persistence; default AOF + `appendfsync always`.
    pub persistence: Persistence,
}

impl Options {
    /// The durable configuration: AOF, `appendfsync always`.
    pub fn durable() -> Self {
        Options {
            persistence: Persistence::AofAlways,
        }
    }

    /// Sets the persistence.
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }
}

/// Starts a private `redis-server` on a free loopback port and waits for PONG.
pub fn start(options: Options) -> io::Result<Store> {
    let program =
        super::which("redis-server").ok_or_else(|| super::missing(Kind::Redis, "redis-server"))?;
    let mut last = None;
    for _ in 0..3 {
        let port = process::free_port()?;
        let dir = super::data_dir(Kind::Redis)?;
        let data = dir.path().to_owned();
        let log = data.join("redis.log");
        let program = program.clone();
        let persistence = options.persistence;
        let command = move || {
            let mut cmd = Command::new(&program);
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .arg("--dir")
                .arg(&data)
                .args(["--daemonize", "no", "--save", ""])
                .args(["--enable-debug-command", "local", "--protected-mode", "no"]);
            match persistence {
                Persistence::None => cmd.args(["--appendonly", "no"]),
                Persistence::AofAlways => {
                    cmd.args(["--appendonly", "yes", "--appendfsync", "always"])
                }
                Persistence::AofEverysec => {
                    cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"])
                }
            };
            cmd
        };
        let spec = Spec {
            kind: Kind::Redis,
            label: format!("redis on 127.0.0.1:{port}"),
            addr: process::loopback(port),
            durable: options.persistence == Persistence::AofAlways,
            dir: Arc::new(dir),
            log,
            clock_file: None,
            launch: Launch {
                command: Box::new(command),
                stop_signal: Signal::SIGTERM,
                stop_grace: Duration::from_secs(10),
                ready_within: Duration::from_secs(30),
                probe: None,
            },
        };
        match Store::launch(spec) {
            Err(e) if super::port_clash(&e) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("redis did not start")))
}

static SHARED: SharedSlot = SharedSlot::new();

/// The Redis of this test binary (durable: AOF, `appendfsync always`), or the
/// server named by `LOCK_TEST_REDIS_URL`.
///
/// # Panics
/// When it cannot be started, with what to install.
pub fn shared() -> Arc<Store> {
    try_shared().unwrap_or_else(|e| panic!("redis store unavailable: {e}"))
}

/// [`shared`] without the panic.
pub fn try_shared() -> io::Result<Arc<Store>> {
    super::shared_store(Kind::Redis, &SHARED, || start(Options::durable()))
}

/// [`shared`], or `None` after a loud SKIP line when `redis-server` is
/// missing and the run is explicitly partial (`LOCK_TEST_PARTIAL=1`, not CI).
pub fn shared_or_skip() -> Option<Arc<Store>> {
    super::shared_or_skip(Kind::Redis, try_shared)
}

/// A conformance [`Factory`](crate::Factory) over the shared Redis, with a
/// private durable Redis for the crash cases. `connect` gets a URL.
pub fn factory<F, Fut, B>(connect: F) -> super::StoreFactory
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<B, lockcore::LockError>> + Send + 'static,
    B: lockcore::LockBackend,
{
    super::factory(
        Kind::Redis,
        try_shared,
        || start(Options::durable()),
        connect,
    )
}
