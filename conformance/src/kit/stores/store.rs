//! `Store`: one server the suite launched (and may hurt) or an external one
//! it only connects to; starting, stopping, killing, pausing, restarting.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::url::StoreUrl;
use super::{Kind, dirs, process};

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
    url: StoreUrl,
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
            .field("url", &self.url.url())
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
        Self::launch_with(spec, None)
    }

    /// [`launch`](Self::launch) for a TLS listener, whose readiness `probe`
    /// replaces `Kind::probe` (which speaks plaintext); the URL's scheme is
    /// then the TLS one (`rediss://`, `etcds://`).
    pub(crate) fn launch_tls(spec: Spec, probe: Probe) -> io::Result<Store> {
        Self::launch_with(spec, Some(probe))
    }

    fn launch_with(spec: Spec, probe: Option<Probe>) -> io::Result<Store> {
        let store = Store {
            kind: spec.kind,
            addr: spec.addr,
            url: StoreUrl::local(spec.kind, spec.addr, probe.is_some()),
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

    /// A store the suite only connects to: `url` from `Kind::url_var`.
    pub(crate) fn external(kind: Kind, url: &str) -> io::Result<Store> {
        let var = kind.env_var();
        let url = StoreUrl::parse(kind, url).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{var}={url:?}: {e}"))
        })?;
        let addr = url.first_addr().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{var}={:?}: cannot resolve its address: {e}", url.url()),
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

    /// The store with `query` (`?name=value...`) after its URL: what
    /// clients need besides the address (a TLS store's `tls_ca`).
    pub(crate) fn with_url_query(mut self, query: &str) -> Store {
        self.url = self.url.clone().with_query(query);
        self
    }

    /// Which store this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The URL clients connect with, in the form the adapter's `connect` and
    /// `distlock::connect` accept: `redis://127.0.0.1:P` (`rediss://` with
    /// TLS), `postgres://postgres@127.0.0.1:P/postgres` (trust auth),
    /// `etcd://127.0.0.1:P` (`etcds://`), `zk://127.0.0.1:P`; for an
    /// external store, the variable's value (default ports filled in).
    pub fn url(&self) -> String {
        self.url.url()
    }

    /// The same URL with the host and port replaced by `addr` (a fault proxy
    /// in front of this store); credentials, database, root and query stay.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        self.url.via(addr).url()
    }

    /// What the store's own client and CLI take: the [`url`](Self::url)
    /// for Redis and PostgreSQL, `http://127.0.0.1:P` (`https://`) for
    /// etcd (`etcd-client`, `etcdctl --endpoints`), the connect string
    /// `127.0.0.1:P[/root]` for ZooKeeper (`zookeeper-client`, `zkCli`).
    pub fn endpoint(&self) -> String {
        self.url.endpoint()
    }

    /// [`endpoint`](Self::endpoint) through `addr` (a fault proxy).
    pub fn endpoint_via(&self, addr: SocketAddr) -> String {
        self.url.via(addr).endpoint()
    }

    /// Where the server listens for clients.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether this is a server named by a `LOCK_TEST_*` variable.
    pub fn is_external(&self) -> bool {
        self.external.is_some()
    }

    /// For an external server, why the suite may not hurt it.
    pub fn why_external(&self) -> Option<String> {
        self.external.clone()
    }

    /// Whether a `kill -9` + restart keeps its data (an external server is
    /// assumed to be configured durably).
    pub fn durable(&self) -> bool {
        self.durable
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
            Some(log) => dirs::tail(log, 4000),
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
        dirs::write_clock_file(file, seconds)
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
            let out = dirs::open_log(log)?;
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
    /// included, which live in their own sessions); returns once every
    /// thread has stopped.
    pub fn pause_now(&self) -> io::Result<()> {
        self.controllable()?;
        let pid = self.running_pid()?;
        let stopped = process::signal_tree(pid, Signal::SIGSTOP)?;
        self.lock().paused = true;
        process::wait_stopped(&stopped, Duration::from_secs(5))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::env;

    #[test]
    fn external_stores_refuse_to_be_hurt_and_say_why() {
        let store = Store::external(Kind::Etcd, "etcd://127.0.0.1:2379,127.0.0.1:2380").unwrap();
        assert!(store.is_external());
        assert_eq!(store.url(), "etcd://127.0.0.1:2379,127.0.0.1:2380");
        assert_eq!(
            store.endpoint(),
            "http://127.0.0.1:2379,http://127.0.0.1:2380"
        );
        assert_eq!(
            store.addr(),
            "127.0.0.1:2379".parse::<SocketAddr>().unwrap()
        );
        for result in [store.kill_now(), store.pause_now(), store.restart_now()] {
            let err = result.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::Unsupported);
            assert!(err.to_string().contains(env::ETCD_URL.name()), "{err}");
        }
        assert!(store.data_dir().is_none());
    }

    #[test]
    fn an_external_url_of_another_form_is_refused_naming_the_variable() {
        let err = Store::external(Kind::ZooKeeper, "127.0.0.1:2181").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let text = err.to_string();
        assert!(
            text.contains(env::ZOOKEEPER_URL.name()) && text.contains("zk://host:port"),
            "{text}"
        );
    }
}
