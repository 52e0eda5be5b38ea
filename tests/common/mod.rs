//! What the CLI tests share: a temp state directory to run `distlock` from
//! (its default lock file), and looking at processes in `/proc`. Bounds are
//! the callers'; waits poll (`kit::poll`), never sleep on a guess.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use lock_conformance::kit::poll;

pub mod store;

/// A temp state directory: every `distlock` started from it shares one
/// default lock file (unless given `--url`).
pub struct Shell {
    pub dir: tempfile::TempDir,
}

impl Shell {
    pub fn new() -> Shell {
        Shell {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn distlock(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
        cmd.args(args)
            .env("XDG_STATE_HOME", self.dir.path().join("state"))
            .env_remove("DISTLOCK_URL")
            .current_dir(self.dir.path());
        cmd
    }

    pub fn output(&self, args: &[&str]) -> Output {
        self.distlock(args).output().unwrap()
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.distlock(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// Polls `check` until it gives `Some`, or panics after `within`.
pub fn eventually<T>(within: Duration, what: &str, check: impl FnMut() -> Option<T>) -> T {
    let mut check = check;
    poll::blocking(within, what, || Ok::<_, poll::TimedOut>(check()))
        .unwrap_or_else(|e| panic!("{e}"))
}

pub fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `pid`'s state letter and parent, from `/proc/PID/stat`.
pub fn stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` is a live process (a zombie waiting to be reaped is not).
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// What a survivor looks like, for a failure message.
pub fn show(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_else(|_| "gone".into())
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: signalling a process the test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// Waits for `child` to exit within `within`, else kills it and panics.
pub fn exit_within(child: &mut Child, within: Duration, what: &str) -> ExitStatus {
    let give_up = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= give_up {
            let _ = child.kill();
            panic!("{what}: distlock did not exit within {within:?}");
        }
        std::thread::sleep(poll::interval());
    }
}

/// The rest of `child`'s stderr.
pub fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(err) = child.stderr.as_mut() {
        std::io::Read::read_to_string(err, &mut text).unwrap();
    }
    text
}

/// Kills the processes it was given when dropped, so a failing test leaves
/// no job (nor a stopped distlock) running behind it.
#[derive(Default)]
pub struct Cleanup(pub Vec<i32>);

impl Cleanup {
    pub fn add(&mut self, pid: i32) {
        self.0.push(pid);
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: only processes this test started; a gone pid only errs.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The processes whose parent is `pid`.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| stat(p).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

/// Whether `pid` cannot run: stopped (`T`), or blocked (`D`) in a `vfork`
/// whose child is stopped (a shell stopped between forking `sleep` and the
/// child's exec stays in `D` until that child runs again).
pub fn held_still(pid: i32) -> bool {
    match stat(pid) {
        Some(('T', _)) => true,
        Some(('D', _)) => children(pid)
            .into_iter()
            .any(|c| stat(c).is_some_and(|(s, _)| s == 'T')),
        _ => false,
    }
}

/// What a child writes to a pipe, read by a thread as it comes, so a test
/// can wait for a line while the child still runs.
pub struct Collected(std::sync::Arc<std::sync::Mutex<String>>);

impl Collected {
    /// Starts reading `pipe` (a child's `stdout` or `stderr`, taken).
    pub fn new(mut pipe: impl std::io::Read + Send + 'static) -> Collected {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = text.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        });
        Collected(text)
    }

    /// Everything read so far.
    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}
