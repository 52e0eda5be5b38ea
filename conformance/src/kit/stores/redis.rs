//! Redis: `redis-server` in the foreground, persistence configurable, and
//! TLS-only serving with certificates the test makes.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::{Kind, Launch, SharedSlot, Spec, Store, net};

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
    /// TLS only, no plaintext port; default off.
    pub tls: Option<Tls>,
    /// More `redis-server` arguments, after the launcher's own (a later
    /// setting wins); default none.
    pub server_args: Vec<String>,
}

impl Options {
    /// The durable configuration: AOF, `appendfsync always`.
    pub fn durable() -> Self {
        Options {
            persistence: Persistence::AofAlways,
            ..Options::default()
        }
    }

    /// Sets the persistence.
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Appends `redis-server` arguments, e.g. `["--maxmemory", "2mb"]`.
    pub fn server_args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.server_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Serves TLS only (`--port 0 --tls-port P`): the store's URL is then
    /// `rediss://127.0.0.1:P`.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// TLS settings, as PEM the test made (e.g. with rcgen): the launcher writes
/// them into the store's data dir, so no test leaves key files behind.
#[derive(Clone)]
pub struct Tls {
    cert_pem: String,
    key_pem: String,
    ca_pem: String,
    auth_clients: bool,
}

impl Tls {
    /// The server's certificate (chain) and private key, and the CA client
    /// certificates must come from (redis-server wants one even when it
    /// does not ask clients for certificates).
    pub fn new(
        cert_pem: impl Into<String>,
        key_pem: impl Into<String>,
        ca_pem: impl Into<String>,
    ) -> Self {
        Tls {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            ca_pem: ca_pem.into(),
            auth_clients: false,
        }
    }

    /// `tls-auth-clients yes`: refuse clients without a certificate from the
    /// CA (default `no`).
    pub fn require_client_certs(mut self, required: bool) -> Self {
        self.auth_clients = required;
        self
    }

    /// Writes the PEM files into `dir`; the `redis-server` arguments that
    /// use them.
    fn args(&self, dir: &Path) -> io::Result<Vec<String>> {
        let file = |name: &str, pem: &str, mode: u32| -> io::Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, pem)?;
            super::set_mode(&path, mode)?;
            Ok(path)
        };
        let cert = file("tls-server.crt", &self.cert_pem, 0o644)?;
        let key = file("tls-server.key", &self.key_pem, 0o600)?;
        let ca = file("tls-ca.crt", &self.ca_pem, 0o644)?;
        let auth = if self.auth_clients { "yes" } else { "no" };
        Ok([
            ("--tls-cert-file", cert.display().to_string()),
            ("--tls-key-file", key.display().to_string()),
            ("--tls-ca-cert-file", ca.display().to_string()),
            ("--tls-auth-clients", auth.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect())
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("key_pem", &"<redacted>")
            .field("auth_clients", &self.auth_clients)
            .finish_non_exhaustive()
    }
}

/// Starts a private `redis-server` on a free loopback port and waits for PONG
/// (with TLS: until its log says it accepts connections on the bound port).
pub fn start(options: Options) -> io::Result<Store> {
    let program =
        super::which("redis-server").ok_or_else(|| super::missing(Kind::Redis, "redis-server"))?;
    let mut last = None;
    for _ in 0..3 {
        let port = net::free_port()?;
        let dir = super::data_dir(Kind::Redis)?;
        let data = dir.path().to_owned();
        let log = data.join("redis.log");
        let program = program.clone();
        let persistence = options.persistence;
        let server_args = options.server_args.clone();
        let tls_args = match &options.tls {
            Some(tls) => Some(tls.args(&data)?),
            None => None,
        };
        // Where this start's log begins: the log is appended across restarts.
        let log_start = Arc::new(AtomicU64::new(0));
        let (log_path, started_at) = (log.clone(), log_start.clone());
        let ready_log = log.clone();
        let command = move || {
            let written = std::fs::metadata(&log_path).map_or(0, |m| m.len());
            started_at.store(written, Ordering::SeqCst);
            let mut cmd = Command::new(&program);
            match &tls_args {
                Some(tls) => cmd
                    .args(["--port", "0", "--tls-port", &port.to_string()])
                    .args(tls),
                None => cmd.args(["--port", &port.to_string()]),
            };
            cmd.args(["--bind", "127.0.0.1"])
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
            cmd.args(&server_args);
            cmd
        };
        let tls = options.tls.is_some();
        let spec = Spec {
            kind: Kind::Redis,
            label: format!(
                "redis{} on 127.0.0.1:{port}",
                if tls { " (TLS)" } else { "" }
            ),
            addr: net::loopback(port),
            durable: options.persistence == Persistence::AofAlways,
            dir: Arc::new(dir),
            log,
            clock_file: None,
            launch: launch(command),
        };
        let launched = if tls {
            let ready: super::Probe = Box::new(move |addr| {
                ready_per_log(addr, &ready_log, log_start.load(Ordering::SeqCst))
            });
            Store::launch_tls(spec, ready)
        } else {
            Store::launch(spec)
        };
        match launched {
            Err(e) if net::port_clash(&e) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("redis did not start")))
}

/// Starts a replica of the Redis at `upstream` (asynchronous, as Redis
/// replication is): `--replicaof`, so a fault proxy at `upstream` cuts and
/// heals replication. It answers reads at once; it has the primary's data
/// once its `INFO replication` says `master_link_status:up` and its offset
/// reached the primary's. Promote it with `REPLICAOF NO ONE`: promoted,
/// it sends its own replicas their first copy at once (no diskless-sync
/// delay).
pub fn start_replica(upstream: SocketAddr, options: Options) -> io::Result<Store> {
    let (ip, port) = (upstream.ip().to_string(), upstream.port().to_string());
    start(options.server_args([
        "--replicaof".to_string(),
        ip,
        port,
        "--repl-diskless-sync-delay".to_string(),
        "0".to_string(),
    ]))
}

/// Starts `count` Redis Sentinels (`redis-server sentinel.conf --sentinel`)
/// that monitor the primary at `primary` as `service`, with a majority
/// quorum, taking it for down after 500 ms without an answer: after a
/// `kill -9` of the primary they promote one of its replicas within a few
/// seconds. Clients find the primary with `redis+sentinel://` and
/// [`sentinel_hosts`].
pub fn start_sentinels(primary: SocketAddr, service: &str, count: usize) -> io::Result<Vec<Store>> {
    let program =
        super::which("redis-server").ok_or_else(|| super::missing(Kind::Redis, "redis-server"))?;
    let quorum = count / 2 + 1;
    (0..count)
        .map(|_| {
            let port = net::free_port()?;
            let dir = super::data_dir(Kind::Redis)?;
            let data = dir.path().to_owned();
            let conf = data.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                     sentinel monitor {service} {} {} {quorum}\n\
                     sentinel down-after-milliseconds {service} 500\n\
                     sentinel failover-timeout {service} 1000\n\
                     sentinel parallel-syncs {service} 1\n",
                    data.display(),
                    primary.ip(),
                    primary.port(),
                ),
            )?;
            let program = program.clone();
            let command = move || {
                let mut cmd = Command::new(&program);
                cmd.arg(&conf).arg("--sentinel");
                cmd
            };
            Store::launch(Spec {
                kind: Kind::Redis,
                label: format!("redis sentinel on 127.0.0.1:{port}"),
                addr: net::loopback(port),
                durable: false,
                log: data.join("sentinel.log"),
                dir: Arc::new(dir),
                clock_file: None,
                launch: launch(command),
            })
        })
        .collect()
}

/// The host list of a `redis+sentinel://` URL for `sentinels`
/// (`127.0.0.1:P1,127.0.0.1:P2,...`).
pub fn sentinel_hosts(sentinels: &[Store]) -> String {
    sentinels
        .iter()
        .map(|s| s.addr().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// How a `redis-server` (or sentinel) runs `command`: stopped with
/// `SIGTERM`, 10 s to stop, 30 s to start.
fn launch(command: impl Fn() -> Command + Send + Sync + 'static) -> Launch {
    Launch {
        command: Box::new(command),
        stop_signal: Signal::SIGTERM,
        stop_grace: Duration::from_secs(10),
        ready_within: Duration::from_secs(30),
        probe: None,
    }
}

/// Readiness of a TLS-only server, without a TLS client here: the port
/// accepts connections, and the log of this start says the server does
/// (it binds its ports and loads its data first).
fn ready_per_log(addr: SocketAddr, log: &Path, from: u64) -> io::Result<bool> {
    TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    let text = std::fs::read(log)?;
    let this_start = text.get(from as usize..).unwrap_or_default();
    Ok(String::from_utf8_lossy(this_start).contains("Ready to accept connections"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_readiness_reads_only_this_starts_log() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("redis.log");
        std::fs::write(&log, "1:M * Ready to accept connections\n").unwrap();
        assert!(ready_per_log(addr, &log, 0).unwrap());
        // A restart appends to the log: the previous start's line does not count.
        let restarted_at = std::fs::metadata(&log).unwrap().len();
        assert!(!ready_per_log(addr, &log, restarted_at).unwrap());
        drop(listener);
        assert!(ready_per_log(addr, &log, 0).is_err(), "nothing listens");
    }
}
