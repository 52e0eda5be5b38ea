//! The conformance factory over a SQLite lock file, and the "store" the
//! fault cases hurt.
//!
//! A lock file has no server: the store is the file plus every process that
//! has it open. So, for the cases that crash or stall the store:
//!
//! - **crash** (`kill`): every client of the file dies: the clients this
//!   factory handed out are closed the way a dying process closes them
//!   (connections and presence files, nothing released), and a helper
//!   process that grants and releases locks on the file in a loop is killed
//!   with `kill -9` mid-write; `restart` reopens the file.
//! - **stall** (`pause`): a helper process takes the file's write lock
//!   (`BEGIN IMMEDIATE`) and is stopped with `SIGSTOP`, so every write
//!   waits, the way a stopped server stalls its clients; `resume` continues
//!   it and kills it, and the kernel drops its locks.
//!
//! Helpers are this test binary run again as the ignored test
//! `sqlite_helper_process`, like the suite's lock-taker: every binary that
//! starts one defines it (`tests/store/main.rs`, `tests/conformance.rs`).

#![allow(dead_code)] // each test binary uses a part

use std::io::{self, BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_conformance::kit::env;
use lock_conformance::{Factory, StoreControl};
use lock_sqlite::SqliteBackend;
use lockcore::backend::async_trait;
use lockcore::{LockBackend, LockError};

/// The variable naming the lock file (`sqlite://PATH`) a helper process (a
/// lock-taker, a helper) must use instead of making its own.
pub(crate) const URL_ENV: env::Var = env::SQLITE_URL;
/// What a helper process does: `write`, `stall`, `hold NAME`,
/// `hold-renewing NAME TTL_MS`, or `rw read|write NAME TTL_MS` (the read
/// or the write of a reader-writer lock, waited for up to an hour).
pub(crate) const HELPER_ENV: &str = "LOCK_SQLITE_HELPER";

/// A lock name the test spells right.
pub(crate) fn name(n: &str) -> lockcore::LockName {
    lockcore::LockName::new(n).unwrap()
}

/// The URL of the lock file at `path`.
pub(crate) fn url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

/// The lock file `LOCK_TEST_SQLITE_URL` names.
fn file_from_env() -> Option<PathBuf> {
    let url = URL_ENV.get()?;
    let path = url.strip_prefix("sqlite://").unwrap_or_else(|| {
        panic!("{URL_ENV}={url:?}: expected sqlite://PATH");
    });
    Some(PathBuf::from(path))
}

/// Hands out clients of one lock file (in a temp dir of its own, or the
/// file `LOCK_TEST_SQLITE_URL` names).
pub(crate) struct SqliteFactory {
    store: Arc<FileStore>,
    _dir: Option<tempfile::TempDir>,
}

impl SqliteFactory {
    /// A factory over a fresh lock file, or the one `LOCK_TEST_SQLITE_URL`
    /// names (in helper processes).
    pub(crate) fn new() -> SqliteFactory {
        match file_from_env() {
            Some(path) => SqliteFactory::at(path, None),
            None => SqliteFactory::fresh(),
        }
    }

    /// A factory over a lock file in a new temp dir.
    pub(crate) fn fresh() -> SqliteFactory {
        let dir = tempfile::Builder::new()
            .prefix("lock-sqlite-")
            .tempdir()
            .expect("a temp dir");
        let path = dir.path().join("locks.db");
        SqliteFactory::at(path, Some(dir))
    }

    fn at(path: PathBuf, dir: Option<tempfile::TempDir>) -> SqliteFactory {
        SqliteFactory {
            store: Arc::new(FileStore {
                path,
                clients: Mutex::default(),
                stalled: Mutex::default(),
            }),
            _dir: dir,
        }
    }

    /// The lock file.
    pub(crate) fn path(&self) -> &Path {
        &self.store.path
    }

    /// The store control of the file.
    pub(crate) fn file_store(&self) -> Arc<FileStore> {
        self.store.clone()
    }
}

impl Default for SqliteFactory {
    fn default() -> Self {
        SqliteFactory::new()
    }
}

#[async_trait]
impl Factory for SqliteFactory {
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        let client = SqliteBackend::connect(&url(&self.store.path)).await?;
        let mut clients = self.store.clients.lock().unwrap();
        clients.retain(|c| c.strong_count() > 0);
        let client = Arc::new(client);
        clients.push(Arc::downgrade(&client));
        Ok(client)
    }

    fn store(&self) -> Option<Arc<dyn StoreControl>> {
        Some(self.store.clone())
    }

    fn no_proxy_reason(&self) -> Option<String> {
        Some(
            "no network between client and store: the lock file is on a local disk, reached \
             through system calls; what a cut or slow link does to a networked store, a stopped \
             or killed process does here (processes::*, store_pause_keeps_invariants)"
                .to_owned(),
        )
    }

    async fn private(&self) -> Option<Result<Arc<dyn Factory>, LockError>> {
        Some(Ok(Arc::new(SqliteFactory::fresh())))
    }

    fn helper_env(&self) -> Vec<(String, String)> {
        vec![(URL_ENV.name().to_owned(), url(&self.store.path))]
    }
}

/// The lock file as a store the fault cases can crash and stall.
pub(crate) struct FileStore {
    path: PathBuf,
    clients: Mutex<Vec<Weak<SqliteBackend>>>,
    stalled: Mutex<Option<Helper>>,
}

#[async_trait]
impl StoreControl for FileStore {
    fn addr(&self) -> SocketAddr {
        // A file has no address; `no_proxy_reason` keeps the proxy cases
        // from ever using this one.
        SocketAddr::from(([127, 0, 0, 1], 9))
    }

    fn durable(&self) -> bool {
        true
    }

    async fn kill(&self) -> io::Result<()> {
        let clients: Vec<_> = self
            .clients
            .lock()
            .unwrap()
            .drain(..)
            .filter_map(|c| c.upgrade())
            .collect();
        for client in clients {
            client.close().await.unwrap();
        }
        let mut writer = helper(&self.path, "write")?;
        expect_line(&mut writer, "writing")?;
        writer.0.kill()?;
        writer.0.wait()?;
        Ok(())
    }

    async fn restart(&self) -> io::Result<()> {
        // Reopening is what the next client does; check the file opens.
        let url = url(&self.path);
        let client = SqliteBackend::connect(&url)
            .await
            .map_err(|e| io::Error::other(format!("cannot reopen the lock file: {e}")))?;
        client.close().await.unwrap();
        Ok(())
    }

    async fn pause(&self) -> io::Result<()> {
        let mut staller = helper(&self.path, "stall")?;
        expect_line(&mut staller, "locked")?;
        signal(&staller.0, libc::SIGSTOP)?;
        *self.stalled.lock().unwrap() = Some(staller);
        Ok(())
    }

    async fn resume(&self) -> io::Result<()> {
        let Some(mut staller) = self.stalled.lock().unwrap().take() else {
            return Err(io::Error::other("not paused"));
        };
        signal(&staller.0, libc::SIGCONT)?;
        staller.0.kill()?;
        staller.0.wait()?;
        Ok(())
    }

    async fn step_clock(&self, _offset_secs: i64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "lock-sqlite judges expiry on the host's CLOCK_BOOTTIME, which no wall-clock step \
             moves (it stores no wall-clock time at all)",
        ))
    }
}

fn signal(child: &Child, sig: i32) -> io::Result<()> {
    // SAFETY: signalling our own child by pid.
    if unsafe { libc::kill(child.id() as i32, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A helper process and its stdout lines.
pub(crate) struct Helper(pub Child, pub std::sync::mpsc::Receiver<String>);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this test binary as the helper doing `what` on the file `path`.
pub(crate) fn helper(path: &Path, what: &str) -> io::Result<Helper> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        "sqlite_helper_process",
        "--nocapture",
        "--test-threads",
        "1",
        "-q",
    ])
    .env(URL_ENV.name(), url(path))
    .env(HELPER_ENV, what)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    // SAFETY: prctl is async-signal-safe; the helper dies with us.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(Helper(child, rx))
}

/// Waits (up to 30 s) for a line containing `HELPER {want}`, and returns it.
pub(crate) fn expect_line(helper: &mut Helper, want: &str) -> io::Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match helper.1.recv_timeout(left) {
            Ok(line) if line.contains(&format!("HELPER {want}")) => return Ok(line),
            Ok(line) if line.contains("HELPER error") => return Err(io::Error::other(line)),
            Ok(_) => {}
            Err(_) => {
                return Err(io::Error::other(format!(
                    "the helper did not say {want:?} within 30 s"
                )));
            }
        }
    }
}

/// The body of the `sqlite_helper_process` test: does what
/// `LOCK_SQLITE_HELPER` says on the file `LOCK_TEST_SQLITE_URL` names.
pub(crate) fn helper_main() {
    let (Some(what), Some(path)) = (std::env::var_os(HELPER_ENV), file_from_env()) else {
        eprintln!("sqlite_helper_process: helper process, started by the tests; nothing to do");
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let result = runtime.block_on(async {
        match what.to_str() {
            Some("write") => write_forever(&path).await,
            Some("stall") => stall_forever(&path).await,
            Some(hold) if hold.starts_with("hold ") => hold_forever(&path, &hold[5..]).await,
            Some(hold) if hold.starts_with("hold-renewing ") => {
                let mut words = hold[14..].split(' ');
                let (name, ttl) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let ttl = ttl.parse().map_err(|_| format!("bad TTL {ttl:?}"))?;
                hold_renewing(&path, name, Duration::from_millis(ttl)).await
            }
            Some(rw) if rw.starts_with("rw ") => rw_forever(&path, &rw[3..]).await,
            other => Err(format!("unknown helper {other:?}")),
        }
    });
    if let Err(e) = result {
        println!("HELPER error {e}");
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the
/// host, to order what two processes saw.
pub(crate) fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "HELPER {line}");
    let _ = out.flush();
}

/// Grants and releases a lock in a loop, so a `kill -9` lands mid-write.
async fn write_forever(path: &Path) -> Result<(), String> {
    use lockcore::backend::LockBackendExt;
    let url = url(path);
    let backend = SqliteBackend::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let name = lockcore::LockName::new("support/crash-writer").unwrap();
    for round in 0_u64.. {
        let lease = backend
            .try_acquire_for(&name, Duration::from_secs(60))
            .await
            .map_err(|e| e.to_string())?
            .into_lease()
            .ok_or("the writer's lock was held")?;
        backend.release(&lease).await.map_err(|e| e.to_string())?;
        if round == 20 {
            say("writing");
        }
    }
    Ok(())
}

/// Takes lock `name` for a minute and keeps renewing it until killed.
async fn hold_forever(path: &Path, name: &str) -> Result<(), String> {
    let url = url(path);
    let backend = SqliteBackend::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let locker = lockcore::Locker::new(backend).ttl(Duration::from_secs(60));
    let guard = locker
        .try_acquire(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the lock was held")?;
    say(&format!("held {}", guard.fencing_token()));
    std::future::pending::<()>().await;
    Ok(())
}

/// Takes lock `name` for `ttl`, renewed as usual, says when it is lost, and
/// keeps running until killed.
async fn hold_renewing(path: &Path, name: &str, ttl: Duration) -> Result<(), String> {
    let url = url(path);
    let backend = SqliteBackend::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let locker = lockcore::Locker::new(backend).ttl(ttl);
    let guard = locker
        .try_acquire(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the lock was held")?;
    say(&format!("held {}", guard.fencing_token().get()));
    let reason = guard.lost().await;
    let at = monotonic_ns();
    say(&format!("lost {reason:?} held={} at={at}", guard.is_held()));
    std::future::pending::<()>().await;
    Ok(())
}

/// Takes (waiting up to an hour) the read or the write of a reader-writer
/// lock (`read|write NAME TTL_MS`), renewed as usual; says `waiting` once
/// it waits, `held FENCE` once granted, and runs until killed.
async fn rw_forever(path: &Path, what: &str) -> Result<(), String> {
    let mut words = what.split(' ');
    let (access, name, ttl) = (words.next(), words.next(), words.next());
    let ttl = ttl.and_then(|t| t.parse().ok()).ok_or("bad TTL")?;
    let backend = SqliteBackend::connect(&url(path))
        .await
        .map_err(|e| e.to_string())?;
    let locker = lockcore::Locker::new(backend).ttl(Duration::from_millis(ttl));
    let lock = locker
        .rw_lock(name.unwrap_or(""))
        .map_err(|e| e.to_string())?;
    say("waiting");
    let guard = match access {
        Some("read") => lock.read_timeout(Duration::from_secs(3600)).await,
        Some("write") => lock.write_timeout(Duration::from_secs(3600)).await,
        other => return Err(format!("bad access {other:?}")),
    }
    .map_err(|e| e.to_string())?;
    say(&format!("held {}", guard.fencing_token().get()));
    std::future::pending::<()>().await;
    Ok(())
}

/// Takes the file's write lock and keeps it until killed.
async fn stall_forever(path: &Path) -> Result<(), String> {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&url(path))
        .await
        .map_err(|e| e.to_string())?;
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    say("locked");
    std::future::pending::<()>().await;
    Ok(())
}

/// `path`'s device and inode as `/proc/self/fdinfo` prints a watch of it:
/// the kernel's device number (`major << 20 | minor`), not `st_dev`.
pub(crate) fn watch_id(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    ((u64::from(major) << 20) | u64::from(minor), meta.ino())
}

/// The inotify instances of this process (by descriptor) that watch the
/// file `id`: another test's instances never watch the files of this
/// test's temp dir.
pub(crate) fn inotify_watching(id: (u64, u64)) -> Vec<i32> {
    let hex = |line: &str, key: &str| {
        let value = line.split(' ').find_map(|w| w.strip_prefix(key))?;
        u64::from_str_radix(value, 16).ok()
    };
    std::fs::read_dir("/proc/self/fdinfo")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let fd: i32 = entry.file_name().to_str()?.parse().ok()?;
            // Gone since the listing: closed, so watching nothing.
            let info = std::fs::read_to_string(entry.path()).ok()?;
            info.lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .any(|l| hex(l, "sdev:") == Some(id.0) && hex(l, "ino:") == Some(id.1))
                .then_some(fd)
        })
        .collect()
}

/// Stops `child` (`SIGSTOP`) at a moment it does not hold the write lock of
/// the lock file at `path`: stopped inside a transaction it would stall
/// every writer of the file (what `stall` does on purpose). While the write
/// lock cannot be had at once, it continues the child and tries again.
pub(crate) async fn stop_outside_a_write(child: &Child, path: &Path) {
    let signal = |sig| {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    };
    for _ in 0..1000 {
        signal(libc::SIGSTOP);
        if write_lock_free(path).await {
            return;
        }
        signal(libc::SIGCONT);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the helper held the file's write lock at every try");
}

/// Whether the write lock of the lock file at `path` can be had at once.
async fn write_lock_free(path: &Path) -> bool {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
    use sqlx::{ConnectOptions, Connection};
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::ZERO)
        .connect()
        .await
        .expect("a connection to the lock file");
    let free = sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .is_ok();
    if free {
        sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    free
}
