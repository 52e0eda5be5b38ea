//! Real stores for the tests: Redis, PostgreSQL, etcd and ZooKeeper started
//! as plain child processes on free loopback ports, each with its data in a
//! fresh temp dir, and hurt on demand (`kill -9`, `SIGSTOP`/`SIGCONT`,
//! restart on the same data and port).
//!
//! Needs the `stores` feature. Each store has a module with the same shape:
//!
//! - `start(Options) -> io::Result<Store>`: a private instance, stopped
//!   cleanly on drop. Tests that kill, pause or restart a store use their own.
//! - `shared() -> Arc<Store>`: one instance per test binary, launched on first
//!   use, or the server named by the store's `LOCK_TEST_*` variable
//!   ([`Store::is_external`]); `shared_or_skip()` for local partial runs.
//! - `factory(connect)`: a [`Factory`](crate::Factory) for `suite!` that
//!   connects clients to the shared store, through fault proxies, and to a
//!   private durable store for the crash cases.
//!
//! ```no_run
//! # #[cfg(feature = "stores")] fn main() -> std::io::Result<()> {
//! use lock_conformance::stores::redis;
//! let store = redis::start(redis::Options::default())?; // AOF, appendfsync always
//! println!("{}", store.url()); // redis://127.0.0.1:2xxxx
//! store.kill_now()?;
//! store.restart_now()?; // same port, same data
//! # Ok(()) }
//! # #[cfg(not(feature = "stores"))] fn main() {}
//! ```
//!
//! # Process hygiene
//! Servers are forked from one long-lived thread with `PR_SET_PDEATHSIG =
//! SIGKILL`, each in its own process group, so they die with the test binary
//! even though `static` shared stores are never dropped; shared stores' data
//! dirs are removed by an `atexit` hook, and dirs left by crashed runs are
//! swept at the next launch.
//!
//! # Missing binaries
//! A missing store binary fails the test with the Debian package to install
//! (`scripts/test-all.sh` installs them all). Only with `LOCK_TEST_PARTIAL=1`,
//! and never when `CI=true`, does `shared_or_skip` (and `factory`) skip
//! instead, with a loud `SKIP` line.

pub mod etcd;
mod factory;
pub mod pki;
mod poll;
pub mod postgres;
pub(crate) mod process;
pub mod redis;
pub mod zookeeper;

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sys::signal::Signal;

pub use factory::{StoreFactory, factory};
pub use poll::{eventually, until};

use crate::StoreControl;

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
                    process::exchange(addr, b"PING\r\n", timeout, |r| r.ends_with(b"\r\n"))?;
                Ok(reply.starts_with(b"+PONG"))
            }
            Kind::Postgres => postgres::probe(addr, timeout),
            Kind::Etcd => etcd::probe(addr, timeout),
            // `ruok` answers before the server serves requests; `srvr` prints a
            // `Mode:` line only once it does.
            Kind::ZooKeeper => {
                let reply = process::exchange(addr, b"srvr", timeout, |_| false)?;
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

/// How to (re)start a launched store.
pub(crate) struct Launch {
    /// Builds the server command (called again for each restart).
    pub(crate) command: Box<dyn Fn() -> Command + Send + Sync>,
    /// The signal for a clean stop (PostgreSQL: SIGINT, "fast" shutdown).
    pub(crate) stop_signal: Signal,
    /// How long a clean stop may take before SIGKILL.
    pub(crate) stop_grace: Duration,
    /// How long start-up may take.
    pub(crate) ready_within: Duration,
    /// Extra readiness condition beyond `Kind::probe` (cluster members).
    pub(crate) probe: Option<Probe>,
}

/// One readiness probe of the server at an address.
pub(crate) type Probe = Box<dyn Fn(SocketAddr) -> io::Result<bool> + Send + Sync>;

struct Running {
    child: Option<Child>,
    paused: bool,
}

/// A store server: one the suite launched (and may hurt), or an external one
/// named by a `LOCK_TEST_*` variable (which it may only connect to).
pub struct Store {
    kind: Kind,
    addr: SocketAddr,
    url: String,
    durable: bool,
    /// `Some(why)` for an external server.
    external: Option<String>,
    launch: Option<Launch>,
    state: Mutex<Running>,
    log: Option<PathBuf>,
    clock_file: Option<PathBuf>,
    dir: Option<Arc<tempfile::TempDir>>,
    label: String,
    /// Replaces `Kind::probe`, which speaks plaintext (a TLS listener).
    own_probe: Option<Probe>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("kind", &self.kind)
            .field("label", &self.label)
            .field("url", &self.url)
            .field("external", &self.external.is_some())
            .field("pid", &self.pid())
            .finish()
    }
}

/// What a kind-specific launcher hands to [`Store::launch`].
pub(crate) struct Spec {
    pub(crate) kind: Kind,
    pub(crate) label: String,
    pub(crate) addr: SocketAddr,
    pub(crate) durable: bool,
    pub(crate) dir: Arc<tempfile::TempDir>,
    pub(crate) log: PathBuf,
    pub(crate) clock_file: Option<PathBuf>,
    pub(crate) launch: Launch,
}

impl Store {
    /// Spawns the server described by `spec` and waits until it serves.
    pub(crate) fn launch(spec: Spec) -> io::Result<Store> {
        let url = spec.kind.url_for(spec.addr);
        Self::launch_with(spec, url, None)
    }

    /// [`launch`](Self::launch) for a server whose clients use `url` and
    /// whose readiness `probe` replaces `Kind::probe` (a TLS listener).
    pub(crate) fn launch_with(spec: Spec, url: String, probe: Option<Probe>) -> io::Result<Store> {
        let store = Store {
            kind: spec.kind,
            addr: spec.addr,
            url,
            durable: spec.durable,
            external: None,
            launch: Some(spec.launch),
            state: Mutex::new(Running {
                child: None,
                paused: false,
            }),
            log: Some(spec.log),
            clock_file: spec.clock_file,
            dir: Some(spec.dir),
            label: spec.label,
            own_probe: probe,
        };
        store.spawn_and_wait()?;
        Ok(store)
    }

    /// A store the suite only connects to: `url` from `Kind::env_var`.
    pub(crate) fn external(kind: Kind, url: String) -> io::Result<Store> {
        let addr = resolve(&first_authority(kind, &url)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{}={url:?}: cannot resolve its address: {e}",
                    kind.env_var()
                ),
            )
        })?;
        Ok(Store {
            kind,
            addr,
            url,
            durable: true,
            external: Some(format!(
                "the {kind} server is external ({} is set): the suite may not kill, pause or restart it",
                kind.env_var()
            )),
            launch: None,
            state: Mutex::new(Running {
                child: None,
                paused: false,
            }),
            log: None,
            clock_file: None,
            dir: None,
            label: format!("external {kind}"),
            own_probe: None,
        })
    }

    /// Which store this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The URL clients connect to: `redis://127.0.0.1:P`,
    /// `postgres://postgres@127.0.0.1:P/postgres` (trust auth),
    /// `http://127.0.0.1:P` (etcd; `https://` when started with TLS),
    /// `127.0.0.1:P` (ZooKeeper); for an external store, the variable's
    /// value as given.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The same URL with the host and port replaced by `addr` (a fault proxy
    /// in front of this store); credentials, database and chroot are kept.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        replace_authority(self.kind, &self.url, addr)
    }

    /// Where the server listens for clients.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether this is a server named by a `LOCK_TEST_*` variable.
    pub fn is_external(&self) -> bool {
        self.external.is_some()
    }

    /// The data dir of a launched store.
    pub fn data_dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(|d| d.path())
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock().child.as_ref().map(Child::id)
    }

    /// Whether the server process is running (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some_and(process::alive)
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        match &self.log {
            Some(log) => process::tail(log, 4000),
            None => format!("({} has no log here)", self.label),
        }
    }

    /// Sets the clock of a store started under libfaketime (PostgreSQL with
    /// `Options::faketime`) to real time + `seconds` (negative: behind), from
    /// the server's next clock read on.
    pub fn set_clock_offset(&self, seconds: i64) -> io::Result<()> {
        let file = self.clock_file.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} was not started under faketime", self.label),
            )
        })?;
        write_clock_file(file, seconds)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn controllable(&self) -> io::Result<&Launch> {
        match (&self.external, &self.launch) {
            (Some(why), _) => Err(io::Error::new(io::ErrorKind::Unsupported, why.clone())),
            (None, Some(launch)) => Ok(launch),
            (None, None) => Err(io::Error::other("store has no launcher")),
        }
    }

    fn running_pid(&self) -> io::Result<u32> {
        self.lock()
            .child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| io::Error::other(format!("{} is not running", self.label)))
    }

    fn spawn_and_wait(&self) -> io::Result<()> {
        let launch = self.controllable()?;
        let mut cmd = (launch.command)();
        if let Some(log) = &self.log {
            let out = open_log(log)?;
            cmd.stdout(out.try_clone()?).stderr(out);
        }
        cmd.stdin(Stdio::null());
        let child = process::spawn(cmd, &format!("starting {}", self.label))?;
        let pid = child.id();
        {
            let mut state = self.lock();
            state.child = Some(child);
            state.paused = false;
        }
        let started = Instant::now();
        let result = process::wait_ready(
            &self.label,
            launch.ready_within,
            || {
                let mut state = self.lock();
                let child = state.child.as_mut()?;
                match child.try_wait() {
                    Ok(Some(status)) => Some(status.to_string()),
                    _ => None,
                }
            },
            || {
                Ok(self.probe_once()?
                    && match &launch.probe {
                        Some(extra) => extra(self.addr)?,
                        None => true,
                    })
            },
        );
        match result {
            Ok(()) => {
                tracing::debug!(store = %self.label, pid, elapsed = ?started.elapsed(), "store serving");
                Ok(())
            }
            Err(e) => {
                self.force_stop();
                Err(io::Error::new(
                    e.kind(),
                    format!("{e}\n--- {} log ---\n{}", self.label, self.log_tail()),
                ))
            }
        }
    }

    /// SIGKILL to the server and every descendant, reap, and wait until all
    /// are gone (PostgreSQL backends would otherwise keep its shared memory).
    fn force_stop(&self) {
        let mut state = self.lock();
        if let Some(mut child) = state.child.take() {
            let pid = child.id();
            let hit = process::signal_tree(pid, Signal::SIGKILL).unwrap_or_default();
            process::wait_exit(&mut child, Duration::from_secs(5));
            process::wait_all_gone(&hit, Duration::from_secs(5));
        }
        state.paused = false;
    }

    /// `kill -9` of the server (and its process group). The data dir stays.
    pub fn kill_now(&self) -> io::Result<()> {
        self.controllable()?;
        self.running_pid()?;
        self.force_stop();
        Ok(())
    }

    /// Stops the server cleanly (its normal shutdown signal, SIGKILL after a
    /// grace period). The data dir stays.
    pub fn stop_now(&self) -> io::Result<()> {
        let launch = self.controllable()?;
        let mut state = self.lock();
        if let Some(mut child) = state.child.take() {
            let pid = child.id();
            if state.paused {
                let _ = process::signal_tree(pid, Signal::SIGCONT);
            }
            let family = process::tree(pid);
            let _ = process::signal(pid, launch.stop_signal);
            if !process::wait_exit(&mut child, launch.stop_grace) {
                tracing::warn!(store = %self.label, "no clean stop within {:?}, SIGKILL", launch.stop_grace);
                let _ = process::signal_tree(pid, Signal::SIGKILL);
                process::wait_exit(&mut child, Duration::from_secs(5));
            }
            process::wait_all_gone(&family, Duration::from_secs(5));
        }
        state.paused = false;
        Ok(())
    }

    /// Starts the server again on the same data dir and port (after a kill or
    /// stop; a running server is stopped cleanly first) and waits until it
    /// serves.
    pub fn restart_now(&self) -> io::Result<()> {
        self.controllable()?;
        if self.lock().child.is_some() {
            self.stop_now()?;
        }
        self.spawn_and_wait()
    }

    /// `SIGSTOP` to the server and every descendant (PostgreSQL backends
    /// included, which live in their own sessions).
    pub fn pause_now(&self) -> io::Result<()> {
        self.controllable()?;
        let pid = self.running_pid()?;
        process::signal_tree(pid, Signal::SIGSTOP)?;
        self.lock().paused = true;
        Ok(())
    }

    /// `SIGCONT` to the server and every descendant.
    pub fn resume_now(&self) -> io::Result<()> {
        self.controllable()?;
        let pid = self.running_pid()?;
        process::signal_tree(pid, Signal::SIGCONT)?;
        self.lock().paused = false;
        Ok(())
    }

    /// Whether it serves right now (one probe).
    pub fn serves(&self) -> bool {
        self.probe_once().unwrap_or(false)
    }

    fn probe_once(&self) -> io::Result<bool> {
        match &self.own_probe {
            Some(probe) => probe(self.addr),
            None => self.kind.probe(self.addr),
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.launch.is_some() && self.external.is_none() {
            let _ = self.stop_now();
        }
    }
}

#[async_trait]
impl StoreControl for Store {
    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn durable(&self) -> bool {
        self.durable
    }

    fn external(&self) -> Option<String> {
        self.external.clone()
    }

    async fn kill(&self) -> io::Result<()> {
        self.kill_now()
    }

    async fn restart(&self) -> io::Result<()> {
        // Start-up takes up to a few seconds of polling; keep the runtime's
        // worker free meanwhile where the runtime allows it.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| self.restart_now())
            }
            _ => self.restart_now(),
        }
    }

    async fn pause(&self) -> io::Result<()> {
        self.pause_now()
    }

    async fn resume(&self) -> io::Result<()> {
        self.resume_now()
    }

    async fn step_clock(&self, offset_secs: i64) -> io::Result<()> {
        self.set_clock_offset(offset_secs)
    }
}

/// A multi-member etcd cluster or ZooKeeper ensemble on loopback.
#[derive(Debug)]
pub struct Cluster {
    /// The members, in member-id order.
    pub members: Vec<Store>,
}

impl Cluster {
    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Store::url).collect()
    }

    /// The ZooKeeper connect string (`host:port,host:port,...`), or the etcd
    /// endpoints joined with commas.
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
        let give_up = Instant::now() + within;
        loop {
            match self.leader() {
                Ok(i) => return Ok(i),
                Err(e) if Instant::now() >= give_up => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no leader within {within:?}: {e}"),
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
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

// ---- shared stores --------------------------------------------------------

type SharedSlot = OnceLock<Result<Arc<Store>, (io::ErrorKind, String)>>;

/// The one store of `kind` for this test binary: the external server if its
/// variable is set, else one launched with `start` on first use. A failure is
/// remembered, so every later caller fails at once with the same message.
pub(crate) fn shared_store(
    kind: Kind,
    slot: &'static SharedSlot,
    start: fn() -> io::Result<Store>,
) -> io::Result<Arc<Store>> {
    let result = slot.get_or_init(|| {
        let store = match std::env::var(kind.env_var()) {
            Ok(url) if !url.trim().is_empty() => Store::external(kind, url.trim().to_owned()),
            _ => start(),
        };
        match store {
            Ok(store) => {
                if let (Some(child_pid), Some(dir)) = (store.pid(), store.data_dir()) {
                    register_cleanup(child_pid, dir.to_owned());
                }
                Ok(Arc::new(store))
            }
            Err(e) => Err((e.kind(), e.to_string())),
        }
    });
    match result {
        Ok(store) => Ok(store.clone()),
        Err((kind, message)) => Err(io::Error::new(*kind, message.clone())),
    }
}

/// Whether a missing store may be skipped: `LOCK_TEST_PARTIAL=1`, and not CI.
pub fn partial_run_allowed() -> bool {
    let partial = std::env::var("LOCK_TEST_PARTIAL").is_ok_and(|v| v == "1");
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    partial && !ci
}

/// `shared()` for local partial runs: `None` (after a loud SKIP line) when the
/// store's binaries are missing and [`partial_run_allowed`]; otherwise the
/// store, or a panic saying what to install.
pub(crate) fn shared_or_skip(
    kind: Kind,
    shared: impl FnOnce() -> io::Result<Arc<Store>>,
) -> Option<Arc<Store>> {
    match shared() {
        Ok(store) => Some(store),
        Err(e) if e.kind() == io::ErrorKind::NotFound && partial_run_allowed() => {
            eprintln!(
                "SKIP: {kind} tests skipped (LOCK_TEST_PARTIAL=1): {e}\n\
                 SKIP: this is a partial run; install with `apt-get install {}` or run scripts/test-all.sh",
                kind.packages()
            );
            None
        }
        Err(e) => panic!("{kind} store unavailable: {e}"),
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

/// A fresh data dir `distlock-<kind>-<pid>-XXXX` under [`process::temp_root`],
/// world-traversable (the PostgreSQL user must enter it).
pub(crate) fn data_dir(kind: Kind) -> io::Result<tempfile::TempDir> {
    process::sweep_stale_dirs();
    let dir = tempfile::Builder::new()
        .prefix(&format!("distlock-{}-{}-", kind.name(), std::process::id()))
        .tempdir_in(process::temp_root())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot create a data dir in {}: {e}",
                    process::temp_root().display()
                ),
            )
        })?;
    set_mode(dir.path(), 0o755)?;
    Ok(dir)
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open log {}: {e}", path.display())))
}

pub(crate) fn write_clock_file(path: &Path, seconds: i64) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, format!("{seconds:+}\n"))?;
    set_mode(&tmp, 0o644)?;
    fs::rename(&tmp, path)
}

/// Whether a failed start looks like a port clash (retry on another port).
pub(crate) fn port_clash(e: &io::Error) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("address already in use")
        || text.contains("addrinuse")
        || text.contains("bindexception")
}

static CLEANUP: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// Shared stores live in statics, which are never dropped: at process exit,
/// kill their process groups and delete their data dirs.
fn register_cleanup(pid: u32, dir: PathBuf) {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        extern "C" fn at_exit() {
            let entries = std::mem::take(&mut *CLEANUP.lock().unwrap_or_else(|p| p.into_inner()));
            for (pid, dir) in entries {
                let _ = process::signal_tree(pid, Signal::SIGKILL);
                let _ = fs::remove_dir_all(dir);
            }
        }
        // SAFETY: registering a plain extern "C" fn; it only signals and removes files.
        unsafe {
            libc::atexit(at_exit);
        }
    });
    CLEANUP
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((pid, dir));
}

// ---- URLs -------------------------------------------------------------------

/// `(before, host:port, after)` of the first endpoint in a store URL.
fn split_authority(kind: Kind, url: &str) -> (String, String, String) {
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

fn first_authority(kind: Kind, url: &str) -> String {
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

fn replace_authority(kind: Kind, url: &str, addr: SocketAddr) -> String {
    let (before, _, after) = split_authority(kind, url);
    format!("{before}{addr}{after}")
}

fn resolve(hostport: &str) -> io::Result<SocketAddr> {
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

    #[test]
    fn external_stores_refuse_to_be_hurt_and_say_why() {
        let store = Store::external(
            Kind::Etcd,
            "http://127.0.0.1:2379,http://127.0.0.1:2380".into(),
        )
        .unwrap();
        assert!(store.is_external());
        assert_eq!(
            store.addr(),
            "127.0.0.1:2379".parse::<SocketAddr>().unwrap()
        );
        for result in [store.kill_now(), store.pause_now(), store.restart_now()] {
            let err = result.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::Unsupported);
            assert!(
                err.to_string().contains("LOCK_TEST_ETCD_ENDPOINTS"),
                "{err}"
            );
        }
        assert!(store.data_dir().is_none());
    }

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
