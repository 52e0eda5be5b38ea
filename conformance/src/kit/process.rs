//! Child processes that die with the test binary, signals to them and their
//! descendants, and waiting for them to start serving or to exit: the
//! plumbing under every store and the lock-taker.

use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::poll::{self, TimedOut};

type Job = Box<dyn FnOnce() + Send>;

/// Runs `f` on the one thread that spawns every child.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
/// not the process. Test threads come and go, so children are forked from a
/// thread that lives as long as the test binary: they then die with it even
/// though a `static` store is never dropped.
fn on_spawner_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> io::Result<R> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("lock-conformance-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("the spawner thread starts");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = reply_tx.send(f());
    });
    sender
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(job)
        .map_err(|_| io::Error::other("the process spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the process spawner thread dropped the request"))
}

/// Spawns `cmd` so that the child gets `SIGKILL` when the test binary exits
/// (however it exits), in its own process group so signals reach the
/// server's helpers too (PostgreSQL backends, a Redis AOF rewrite child).
pub(crate) fn spawn(mut cmd: Command, what: &str) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    cmd.process_group(0);
    // SAFETY: prctl and getppid are async-signal-safe; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let program = cmd.get_program().to_string_lossy().into_owned();
    on_spawner_thread(move || cmd.spawn())?.map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{what}: `{program}` is not installed ({e})"),
            )
        } else {
            io::Error::new(e.kind(), format!("{what}: cannot start `{program}`: {e}"))
        }
    })
}

/// Whether `pid` still runs. A zombie does not: kill(0) succeeds on zombies,
/// and PID 1 on some machines reaps orphans seconds late.
pub(crate) fn alive(pid: u32) -> bool {
    if kill(Pid::from_raw(pid as i32), None).is_err() {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => !status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z')),
        Err(_) => false,
    }
}

/// Sends `sig` to the process group led by `pid` (every store is started as
/// a group leader), falling back to the process itself.
pub(crate) fn signal_group(pid: u32, sig: Signal) -> io::Result<()> {
    let pid = Pid::from_raw(pid as i32);
    killpg(pid, sig)
        .or_else(|_| kill(pid, sig))
        .map_err(|e| io::Error::other(format!("cannot send {sig} to process {pid}: {e}")))
}

/// Sends `sig` to `pid` only.
pub(crate) fn signal(pid: u32, sig: Signal) -> io::Result<()> {
    kill(Pid::from_raw(pid as i32), sig)
        .map_err(|e| io::Error::other(format!("cannot send {sig} to process {pid}: {e}")))
}

/// Waits up to `grace` for `child` to exit (reaping it), returning whether it did.
pub(crate) fn wait_exit(child: &mut Child, grace: Duration) -> bool {
    poll::blocking(grace, "the process's exit", || {
        Ok::<_, TimedOut>(match child.try_wait() {
            Ok(Some(_)) | Err(_) => Some(()),
            Ok(None) => None,
        })
    })
    .is_ok()
}

/// `pid` and all its descendants (by parent pid, from /proc).
pub(crate) fn tree(root: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // Fields after the ")" closing the command name: state ppid ...
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        at += 1;
    }
    found
}

/// Sends `sig` to `root`'s process group and to every descendant of `root`:
/// PostgreSQL backends each call `setsid()`, so a group signal alone would
/// leave them serving (or, after a kill, holding shared memory). The root is
/// signalled first so it forks nothing new meanwhile. Returns the pids hit.
pub(crate) fn signal_tree(root: u32, sig: Signal) -> io::Result<Vec<u32>> {
    if sig == Signal::SIGKILL {
        // Killed children are re-parented at once and drop out of the tree:
        // freeze the tree first, then kill everything found.
        let hit = signal_tree(root, Signal::SIGSTOP)?;
        let _ = signal_group(root, Signal::SIGKILL);
        for &pid in &hit {
            let _ = signal(pid, Signal::SIGKILL);
        }
        return Ok(hit);
    }
    signal_group(root, sig)?;
    let mut hit = vec![root];
    for _ in 0..3 {
        let mut new = false;
        for pid in tree(root) {
            if !hit.contains(&pid) {
                let _ = signal(pid, sig);
                hit.push(pid);
                new = true;
            }
        }
        if !new {
            break;
        }
    }
    Ok(hit)
}

/// Whether every thread of `pid` is stopped (state `T`), or it is gone.
fn stopped(pid: u32) -> bool {
    let Ok(threads) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    threads.flatten().all(|thread| {
        // Fields after the ")" closing the command name: state ppid ...
        fs::read_to_string(thread.path().join("stat")).map_or(true, |stat| {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next());
            matches!(state, Some("T" | "Z" | "X") | None)
        })
    })
}

/// Waits until every thread of each of `pids` is stopped: `SIGSTOP` takes
/// effect after `kill()` returns, when each thread next enters the kernel,
/// and a thread on another CPU may still answer a request meanwhile.
pub(crate) fn wait_stopped(pids: &[u32], within: Duration) -> io::Result<()> {
    poll::blocking(within, "the processes' stop", || {
        Ok::<_, io::Error>(pids.iter().all(|&p| stopped(p)).then_some(()))
    })
}

/// Waits until none of `pids` runs any more (zombies count as gone).
pub(crate) fn wait_all_gone(pids: &[u32], within: Duration) -> bool {
    poll::blocking(within, "the processes' exit", || {
        Ok::<_, TimedOut>((!pids.iter().any(|&p| alive(p))).then_some(()))
    })
    .is_ok()
}

/// Polls `ready` until it returns `Ok(true)`, the process exits, or `within`
/// passes; the error says which and carries the last probe error.
pub(crate) fn wait_ready(
    what: &str,
    within: Duration,
    mut exited: impl FnMut() -> Option<String>,
    mut ready: impl FnMut() -> io::Result<bool>,
) -> io::Result<()> {
    let mut last = String::new();
    poll::blocking(within, what, || {
        last = match ready() {
            Ok(true) => return Ok(Some(())),
            Ok(false) => "not serving yet".to_owned(),
            Err(e) => e.to_string(),
        };
        match exited() {
            Some(status) => Err(io::Error::other(format!(
                "{what} exited during start-up ({status})"
            ))),
            None => Ok(None),
        }
    })
    .map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what} not serving after {within:?} (last probe: {last})"),
        ),
        _ => e,
    })
}
