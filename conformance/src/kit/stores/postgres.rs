//! PostgreSQL: `initdb` + `postgres` in the foreground, run as the
//! unprivileged `postgres` user (both refuse to run as root).

use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::{Kind, Launch, SharedSlot, Spec, Store, net, process};

/// Launch options.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// `max_connections` (default 200: waiters may each hold a connection).
    pub max_connections: u32,
    /// `fsync` and `full_page_writes` (default on: defaults never trade
    /// durability; fsync costs ~60 µs here).
    pub fsync: bool,
    /// Start `postgres` under libfaketime so [`Store::set_clock_offset`] can
    /// step the server's wall clock (`now()`, `clock_timestamp()`) at run
    /// time; monotonic time stays real.
    pub faketime: bool,
    /// Extra server settings, passed as `-c name=value` after the defaults
    /// (so they win): e.g. `default_transaction_isolation=serializable`.
    pub settings: Vec<(String, String)>,
    /// Every role but `postgres` (the launcher's, still trusted, so
    /// [`Store::url`] works) authenticates over TCP with a password
    /// (`scram-sha-256`): for tests of wrong passwords. Create the role
    /// with `CREATE ROLE name LOGIN PASSWORD '...'` over [`Store::url`].
    pub password_auth: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_connections: 200,
            fsync: true,
            faketime: false,
            settings: Vec::new(),
            password_auth: false,
        }
    }
}

impl Options {
    /// Sets `max_connections`.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets `fsync` / `full_page_writes`.
    pub fn fsync(mut self, on: bool) -> Self {
        self.fsync = on;
        self
    }

    /// Runs the server under libfaketime (package `libfaketime`).
    pub fn faketime(mut self, on: bool) -> Self {
        self.faketime = on;
        self
    }

    /// Asks every role but `postgres` for its password (see
    /// [`password_auth`](Self::password_auth)).
    pub fn password_auth(mut self, on: bool) -> Self {
        self.password_auth = on;
        self
    }

    /// Adds a server setting (`-c name=value`).
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }
}

/// The PostgreSQL server binaries: `LOCK_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `pg_config --bindir`.
pub fn bin_dir() -> io::Result<PathBuf> {
    if let Some(dir) = crate::kit::env::PG_BIN.get() {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Ok(bin);
    }
    Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.join("postgres").is_file())
        .ok_or_else(|| super::missing(Kind::Postgres, "the PostgreSQL server (postgres, initdb)"))
}

/// The uid and gid the server runs as: the `postgres` user when we are root
/// (created as a system user if missing), else ourselves.
fn server_user() -> io::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    if let Some(ids) = lookup_user("postgres")? {
        return Ok(Some(ids));
    }
    let status = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "postgres",
        ])
        .status()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run useradd to create the postgres user: {e}"),
            )
        })?;
    if !status.success() {
        // Another test binary may have created it meanwhile.
        if let Some(ids) = lookup_user("postgres")? {
            return Ok(Some(ids));
        }
        return Err(io::Error::other(format!(
            "useradd postgres failed: {status}"
        )));
    }
    lookup_user("postgres")?
        .map(Some)
        .ok_or_else(|| io::Error::other("the postgres user was created but cannot be found"))
}

fn lookup_user(name: &str) -> io::Result<Option<(u32, u32)>> {
    let passwd = fs::read_to_string("/etc/passwd")?;
    Ok(passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next()? == name).then_some(())?;
        let uid = f.nth(1)?.parse().ok()?;
        let gid = f.next()?.parse().ok()?;
        Some((uid, gid))
    }))
}

fn chown(path: &Path, user: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| io::Error::new(e.kind(), format!("chown {}: {e}", path.display())))?;
    }
    Ok(())
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
        cmd.env("HOME", "/tmp")
            .env("USER", "postgres")
            .env("LOGNAME", "postgres");
    }
}

fn faketime_library() -> io::Result<PathBuf> {
    let candidates = fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketime.so.1")]);
    for path in candidates {
        if path.is_file() {
            return Ok(path);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "libfaketime.so.1 not found: install it with `apt-get install -y libfaketime` (scripts/test-all.sh does)",
    ))
}

/// Starts a private PostgreSQL: `initdb` (trust auth, user `postgres`; with
/// [`Options::password_auth`], passwords for every other role) in a fresh
/// dir, then `postgres` on a free loopback port.
pub fn start(options: Options) -> io::Result<Store> {
    let server = Server::prepare()?;
    let (bin, data) = (&server.bin, &server.data);

    let mut initdb = Command::new(bin.join("initdb"));
    initdb.arg("-D").arg(data).args([
        "-U",
        "postgres",
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
    ]);
    server.fill(initdb, "initdb")?;
    server.launch(options)
}

/// Starts a streaming standby of the PostgreSQL server at `upstream`
/// (asynchronous, hot: it answers reads): `pg_basebackup -R` from
/// `upstream`, whose address its `primary_conninfo` keeps, so a fault
/// proxy there cuts and heals replication. Promote it with
/// `SELECT pg_promote()`. Its `application_name` is `standby` (name it in
/// the primary's `synchronous_standby_names` for synchronous replication).
pub fn start_standby(upstream: SocketAddr, options: Options) -> io::Result<Store> {
    let server = Server::prepare()?;
    let mut backup = Command::new(server.bin.join("pg_basebackup"));
    backup
        .args(["-h", &upstream.ip().to_string()])
        .args(["-p", &upstream.port().to_string()])
        .args(["-U", "postgres", "-D"])
        .arg(&server.data)
        .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"])
        .args(["-d", "application_name=standby"]);
    server.fill(backup, &format!("pg_basebackup from {upstream}"))?;
    server.launch(options)
}

/// A server's files before it runs: binaries, user, and a fresh data
/// directory (empty, for `initdb` or `pg_basebackup` to fill).
struct Server {
    bin: PathBuf,
    user: Option<(u32, u32)>,
    dir: Arc<tempfile::TempDir>,
    data: PathBuf,
    run: PathBuf,
}

impl Server {
    fn prepare() -> io::Result<Server> {
        let bin = bin_dir()?;
        let user = server_user()?;
        let dir = Arc::new(super::data_dir(Kind::Postgres)?);
        let data = dir.path().join("data");
        let run = dir.path().join("run");
        fs::create_dir(&data)?;
        super::set_mode(&data, 0o700)?;
        chown(&data, user)?;
        fs::create_dir(&run)?;
        super::set_mode(&run, 0o755)?;
        chown(&run, user)?;
        Ok(Server {
            bin,
            user,
            dir,
            data,
            run,
        })
    }

    /// Runs `command` (which fills the data directory) as the server's
    /// user, to its end; its output is the error if it fails.
    fn fill(&self, mut command: Command, what: &str) -> io::Result<()> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        as_user(&mut command, self.user);
        let out = process::spawn(command, what)?
            .wait_with_output()
            .map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{what} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// Runs `postgres` on the prepared data directory, on a free port.
    fn launch(self, options: Options) -> io::Result<Store> {
        let Server {
            bin,
            user,
            dir,
            data,
            run,
        } = self;
        let log = dir.path().join("postgres.log");
        let faketime = if options.faketime {
            Some(faketime_library()?)
        } else {
            None
        };

        if options.password_auth {
            // initdb wrote the file as the server's user: rewriting keeps that.
            fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\n\
             host all postgres 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n",
            )?;
        }

        let clock_file = faketime.as_ref().map(|_| dir.path().join("faketime.rc"));
        if let Some(file) = &clock_file {
            super::write_clock_file(file, 0)?;
        }
        let mut last = None;
        for _ in 0..3 {
            let port = net::free_port()?;
            let (bin, data, run, faketime, clock) = (
                bin.clone(),
                data.clone(),
                run.clone(),
                faketime.clone(),
                clock_file.clone(),
            );
            let options = options.clone();
            let command = move || {
                let mut cmd = Command::new(bin.join("postgres"));
                let on_off = if options.fsync { "on" } else { "off" };
                cmd.arg("-D")
                    .arg(&data)
                    .args(["-p", &port.to_string()])
                    .args(["-c", "listen_addresses=127.0.0.1"])
                    .arg("-c")
                    .arg(format!("unix_socket_directories={}", run.display()))
                    .args([
                        "-c",
                        &format!("fsync={on_off}"),
                        "-c",
                        &format!("full_page_writes={on_off}"),
                    ])
                    .args([
                        "-c",
                        &format!("max_connections={}", options.max_connections),
                    ])
                    .args(["-c", "logging_collector=off"]);
                for (name, value) in &options.settings {
                    cmd.arg("-c").arg(format!("{name}={value}"));
                }
                if let (Some(lib), Some(file)) = (&faketime, &clock) {
                    cmd.env("LD_PRELOAD", lib)
                        .env("FAKETIME_TIMESTAMP_FILE", file)
                        .env("FAKETIME_NO_CACHE", "1")
                        .env("DONT_FAKE_MONOTONIC", "1")
                        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
                }
                as_user(&mut cmd, user);
                cmd
            };
            let spec = Spec {
                kind: Kind::Postgres,
                label: format!("postgres on 127.0.0.1:{port}"),
                addr: net::loopback(port),
                durable: options.fsync,
                dir: dir.clone(),
                log: log.clone(),
                clock_file: clock_file.clone(),
                launch: Launch {
                    command: Box::new(command),
                    // SIGINT = "fast" shutdown (what `pg_ctl -m fast` sends).
                    stop_signal: Signal::SIGINT,
                    stop_grace: Duration::from_secs(20),
                    ready_within: Duration::from_secs(60),
                    probe: None,
                },
            };
            match Store::launch(spec) {
                Err(e) if net::port_clash(&e) => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("postgres did not start")))
    }
}

/// One readiness probe: a protocol-3.0 startup as `postgres` (trust auth)
/// must end in ReadyForQuery; "the database system is starting up" and
/// other errors mean not yet.
pub(crate) fn probe(addr: SocketAddr, timeout: Duration) -> io::Result<bool> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let params = b"user\0postgres\0database\0postgres\0\0";
    let mut startup = Vec::with_capacity(8 + params.len());
    startup.extend_from_slice(&((8 + params.len()) as i32).to_be_bytes());
    startup.extend_from_slice(&196_608_i32.to_be_bytes()); // protocol 3.0
    startup.extend_from_slice(params);
    stream.write_all(&startup)?;
    let mut buf = Vec::new();
    let mut chunk = [0_u8; 1024];
    loop {
        // Walk complete messages: type byte + i32 length (including itself).
        let mut at = 0;
        while buf.len() >= at + 5 {
            let kind = buf[at];
            let len = i32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]);
            let Ok(len) = usize::try_from(len) else {
                return Ok(false);
            };
            if buf.len() < at + 1 + len {
                break;
            }
            match kind {
                b'Z' => {
                    let _ = stream.write_all(&[b'X', 0, 0, 0, 4]); // Terminate
                    return Ok(true);
                }
                b'E' => return Ok(false),
                _ => at += 1 + len,
            }
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(false);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

static SHARED: SharedSlot = SharedSlot::new();
static CONFIGURED: SharedSlot = SharedSlot::new();
static CONFIGURED_SETTINGS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// The PostgreSQL of this test binary (default options), or the server named
/// by `LOCK_TEST_POSTGRES_URL`.
///
/// # Panics
/// When it cannot be started, with what to install.
pub fn shared() -> Arc<Store> {
    try_shared().unwrap_or_else(|e| panic!("postgres store unavailable: {e}"))
}

/// [`shared`] without the panic.
pub fn try_shared() -> io::Result<Arc<Store>> {
    super::shared_store(Kind::Postgres, &SHARED, || start(Options::default()))
}

/// [`shared`], or `None` after a loud SKIP line when PostgreSQL is missing
/// and the run is explicitly partial (`LOCK_TEST_PARTIAL=1`, not CI).
pub fn shared_or_skip() -> Option<Arc<Store>> {
    super::shared_or_skip(Kind::Postgres, try_shared)
}

/// The PostgreSQL of this test binary started with extra server `settings`
/// (`-c name=value`), apart from [`shared`]'s, or the server named by
/// `LOCK_TEST_POSTGRES_URL` (whose settings are then the caller's business).
///
/// # Panics
/// When called again in the same binary with other settings: one set per
/// test binary.
pub fn try_shared_with_settings(settings: &[(String, String)]) -> io::Result<Arc<Store>> {
    let kept = CONFIGURED_SETTINGS.get_or_init(|| settings.to_vec());
    assert_eq!(kept, settings, "one set of server settings per test binary");
    super::shared_store(Kind::Postgres, &CONFIGURED, || {
        start(with_settings(Options::default(), settings))
    })
}

/// `options` with `settings` added (`-c name=value`, after the defaults).
pub fn with_settings(options: Options, settings: &[(String, String)]) -> Options {
    settings
        .iter()
        .fold(options, |o, (k, v)| o.setting(k.clone(), v.clone()))
}
