//! etcd: single member (plaintext or TLS on the client port), or a 3-member
//! cluster on loopback.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

mod ctl;

use ctl::enable_auth;
pub use ctl::{restore, snapshot};

pub use super::ClientTls;
use super::client_tls::write_pem;
use super::{Cluster, Kind, Launch, SharedSlot, Spec, Store, net};

/// Launch options.
#[derive(Clone)]
#[non_exhaustive]
pub struct Options {
    /// `--heartbeat-interval` in ms (default 10).
    pub heartbeat_ms: u32,
    /// `--election-timeout` in ms (default 100). etcd's smallest lease TTL is
    /// 1.5 × this rounded up to whole seconds, so 100 ms allows 1 s leases
    /// (the default 1 s election timeout silently turns 1 s leases into 2 s).
    pub election_timeout_ms: u32,
    /// Serve clients over TLS (default: plaintext). Single member only.
    pub tls: Option<ClientTls>,
    /// Turn authentication on once started, with this password for the
    /// `root` user (default: off). Plaintext, single member only.
    pub root_password: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            heartbeat_ms: 10,
            election_timeout_ms: 100,
            tls: None,
            root_password: None,
        }
    }
}

impl Options {
    /// Sets heartbeat and election timeout (ms).
    pub fn timing(mut self, heartbeat_ms: u32, election_timeout_ms: u32) -> Self {
        self.heartbeat_ms = heartbeat_ms;
        self.election_timeout_ms = election_timeout_ms;
        self
    }

    /// Serves clients over TLS: the store's URL is then `etcds://127.0.0.1:P`
    /// (its endpoint `https://127.0.0.1:P`).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Turns authentication on once the member is up (`etcdctl user add
    /// root`, `auth enable`): clients then need `root` and `password` (in a
    /// URL: `etcd://root:<percent-encoded password>@127.0.0.1:P`); a wrong
    /// one is refused. The password may hold any character.
    pub fn root_password(mut self, password: impl Into<String>) -> Self {
        self.root_password = Some(password.into());
        self
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        f.debug_struct("Options")
            .field("heartbeat_ms", &self.heartbeat_ms)
            .field("election_timeout_ms", &self.election_timeout_ms)
            .field("tls", &self.tls)
            .field("auth", &self.root_password.is_some())
            .finish()
    }
}

/// Writes the PEM files etcd reads into `dir` (the key owner-only); the
/// arguments that name them.
fn write_tls(tls: &ClientTls, dir: &Path) -> io::Result<Vec<String>> {
    let file = |name: &str, pem: &str, mode: u32| -> io::Result<String> {
        let path = write_pem(dir, name, pem, mode)?;
        Ok(path.to_string_lossy().into_owned())
    };
    let mut args = vec![
        "--cert-file".to_owned(),
        file("server.pem", &tls.cert_pem, 0o644)?,
        "--key-file".to_owned(),
        file("server-key.pem", &tls.key_pem, 0o600)?,
    ];
    if tls.client_cert_auth {
        args.extend([
            "--client-cert-auth".to_owned(),
            "--trusted-ca-file".to_owned(),
            file("ca.pem", &tls.ca_pem, 0o644)?,
        ]);
    }
    Ok(args)
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

fn healthy(reply: &[u8]) -> bool {
    String::from_utf8_lossy(reply).contains("\"health\":\"true\"")
}

/// One plaintext readiness probe: `/health` says true.
pub(crate) fn probe(addr: SocketAddr, timeout: Duration) -> io::Result<bool> {
    let reply = net::exchange(addr, HEALTH, timeout, |_| false)?;
    Ok(healthy(&reply))
}

fn program() -> io::Result<PathBuf> {
    super::which("etcd").ok_or_else(|| super::missing(Kind::Etcd, "etcd"))
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
}

#[allow(clippy::too_many_arguments)]
fn spec(
    program: PathBuf,
    member: &Member,
    initial_cluster: String,
    token: String,
    options: &Options,
    stop_signal: Signal,
) -> io::Result<Spec> {
    let dir = Arc::new(super::data_dir(Kind::Etcd)?);
    let data = dir.path().join("data");
    let log = dir.path().join("etcd.log");
    let (name, client, peer) = (member.name.clone(), member.client, member.peer);
    let tls_args = match &options.tls {
        Some(tls) => write_tls(tls, dir.path())?,
        None => Vec::new(),
    };
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let options = options.clone();
    let command = move || {
        let mut cmd = Command::new(&program);
        let client_url = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        cmd.args(["--name", &name])
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args([
                "--initial-cluster",
                &initial_cluster,
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", &token])
            .args(["--heartbeat-interval", &options.heartbeat_ms.to_string()])
            .args([
                "--election-timeout",
                &options.election_timeout_ms.to_string(),
            ])
            .args(&tls_args)
            .args(["--logger", "zap", "--log-level", "warn"]);
        cmd
    };
    Ok(Spec {
        kind: Kind::Etcd,
        label: format!("etcd {} on 127.0.0.1:{client}", member.name),
        addr: net::loopback(client),
        durable: true,
        dir,
        log,
        clock_file: None,
        launch: Launch {
            command: Box::new(command),
            stop_signal,
            stop_grace: Duration::from_secs(10),
            ready_within: Duration::from_secs(60),
            probe: None,
        },
    })
}

/// Starts a private single-member etcd on free loopback ports (client and
/// peer) and waits until `/health` says true (over TLS with
/// [`Options::tls`]).
pub fn start(options: Options) -> io::Result<Store> {
    let program = program()?;
    let mut last = None;
    for _ in 0..3 {
        let member = Member {
            name: "solo".into(),
            client: net::free_port()?,
            peer: net::free_port()?,
        };
        let cluster = format!("solo=http://127.0.0.1:{}", member.peer);
        let token = format!("distlock-{}", member.client);
        let spec = spec(
            program.clone(),
            &member,
            cluster,
            token,
            &options,
            Signal::SIGTERM,
        )?;
        let launched = match &options.tls {
            Some(tls) => Store::launch_tls(spec, tls.probe(HEALTH, healthy)?),
            None => Store::launch(spec),
        };
        match launched {
            Err(e) if net::port_clash(&e) => last = Some(e),
            Ok(store) => {
                if let Some(password) = &options.root_password {
                    enable_auth(&store, password)?;
                }
                return Ok(store);
            }
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("etcd did not start")))
}

/// Starts a `size`-member cluster on loopback (heartbeat 50 ms, election
/// timeout 500 ms: calmer than the single-member default on a busy 2-core
/// machine, still 1 s leases) and waits until every member is healthy.
pub fn start_cluster(size: usize) -> io::Result<Cluster> {
    let program = program()?;
    let options = Options::default().timing(50, 500);
    let members: Vec<Member> = (1..=size)
        .map(|i| {
            Ok(Member {
                name: format!("m{i}"),
                client: net::free_port()?,
                peer: net::free_port()?,
            })
        })
        .collect::<io::Result<_>>()?;
    let initial: Vec<String> = members
        .iter()
        .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
        .collect();
    let initial = initial.join(",");
    let token = format!("distlock-cluster-{}", members[0].client);
    // Members wait for each other before /health turns true: launch each on
    // its own thread, in parallel.
    let handles: Vec<_> = members
        .iter()
        .map(|m| {
            let spec = spec(
                program.clone(),
                m,
                initial.clone(),
                token.clone(),
                &options,
                Signal::SIGKILL,
            );
            std::thread::spawn(move || Store::launch(spec?))
        })
        .collect();
    Cluster::join("etcd cluster", handles)
}

/// Whether the member at `addr` is the raft leader (`/v3/maintenance/status`:
/// its own member id equals the leader id).
pub fn is_leader(addr: SocketAddr) -> io::Result<bool> {
    let reply = net::exchange(
        addr,
        b"POST /v3/maintenance/status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        Duration::from_millis(500),
        |_| false,
    )?;
    let text = String::from_utf8_lossy(&reply);
    let member = json_string(&text, "member_id");
    let leader = json_string(&text, "leader");
    match (member, leader) {
        (Some(m), Some(l)) => Ok(m == l),
        _ => Err(io::Error::other(format!("unexpected status reply: {text}"))),
    }
}

fn json_string(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let end = text[at..].find('"')?;
    Some(text[at..at + end].to_owned())
}

static SHARED: SharedSlot = SharedSlot::new();

/// The etcd of this test binary, or the server named by
/// `LOCK_TEST_ETCD_URL` (`etcd://host:port[,host:port]`; the first one is
/// proxied and probed).
///
/// # Panics
/// When it cannot be started, with what to install.
pub fn shared() -> Arc<Store> {
    try_shared().unwrap_or_else(|e| panic!("etcd store unavailable: {e}"))
}

/// [`shared`] without the panic.
pub fn try_shared() -> io::Result<Arc<Store>> {
    super::shared_store(Kind::Etcd, &SHARED, || start(Options::default()))
}

/// [`shared`], or `None` after a loud SKIP line when etcd is missing and the
/// run is explicitly partial (`LOCK_TEST_PARTIAL=1`, not CI).
pub fn shared_or_skip() -> Option<Arc<Store>> {
    super::shared_or_skip(Kind::Etcd, try_shared)
}
