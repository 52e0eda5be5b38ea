//! Running a command under a lock and really stopping it: its own process
//! group, signals forwarded to the group, the group stopped (TERM, then
//! KILL after a grace period) when the lease is lost, and the lock released
//! only once no process of the group is left.

use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use super::exit::{self, Failure};

/// A command started in a process group of its own.
pub(crate) struct Job {
    child: Child,
    group: i32,
    /// The signals forwarded to the group, caught from before the spawn.
    forwarded: Vec<(i32, Signal)>,
}

/// How a supervised command ended.
pub(crate) struct Ended<R> {
    /// The command's exit status.
    pub(crate) status: ExitStatus,
    /// Why the lock was lost while it ran, if it was.
    pub(crate) lost: Option<R>,
}

/// Starts `command` with `env` in a new process group. On Linux it gets
/// `SIGKILL` if distlock dies first (a parent-death signal).
pub(crate) fn spawn(command: &[String], env: &[(&str, String)]) -> Result<Job, Failure> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Failure::Code(exit::USAGE, "no command to run".into()))?;
    // Caught before the command starts: a SIGTERM that came between the
    // spawn and the first wait would otherwise end distlock at once, and
    // the parent-death signal reaches the child, not its children.
    let mut forwarded = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ] {
        let stream = signal(kind)
            .map_err(|e| Failure::Code(exit::STORE, format!("cannot handle signals: {e}")))?;
        forwarded.push((kind.as_raw_value(), stream));
    }
    let mut cmd = Command::new(program);
    cmd.args(args).process_group(0);
    for (key, value) in env {
        cmd.env(key, value);
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: prctl and getppid are async-signal-safe; nothing else runs
        // between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // distlock died before the signal was armed.
                if libc::getppid() != parent {
                    return Err(io::Error::other(
                        "distlock exited before the command started",
                    ));
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(|e| {
        let code = if e.kind() == io::ErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        };
        Failure::Code(code, format!("cannot run {program:?}: {e}"))
    })?;
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| Failure::Code(exit::STORE, "the command exited at once".into()))?;
    Ok(Job {
        child,
        group,
        forwarded,
    })
}

impl Job {
    /// Waits for the command while `lost` has not fired, forwarding SIGINT,
    /// SIGTERM, SIGHUP and SIGQUIT to its group. When `lost` fires, the group
    /// gets SIGTERM, then SIGKILL after `grace`. Once the command exits, any
    /// process it left in its group is stopped the same way. Returns when no
    /// process of the group is left.
    pub(crate) async fn supervise<R>(
        mut self,
        lost: impl Future<Output = R>,
        grace: Duration,
    ) -> Result<Ended<R>, Failure> {
        let mut forwarded = std::mem::take(&mut self.forwarded);
        let (sigint, rest) = forwarded.split_at_mut(1);
        let (sigterm, rest) = rest.split_at_mut(1);
        let (sighup, sigquit) = rest.split_at_mut(1);
        let (sigint, sigterm, sighup, sigquit) = (
            &mut sigint[0],
            &mut sigterm[0],
            &mut sighup[0],
            &mut sigquit[0],
        );
        tokio::pin!(lost);
        let mut lost_reason = None;
        let mut kill_at: Option<Instant> = None;
        let status = loop {
            let deadline = kill_at;
            let kill = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                status = self.child.wait() => break status.map_err(|e| {
                    Failure::Code(exit::STORE, format!("cannot wait for the command: {e}"))
                })?,
                reason = &mut lost, if lost_reason.is_none() => {
                    lost_reason = Some(reason);
                    signal_group(self.group, libc::SIGTERM);
                    kill_at = Some(Instant::now() + grace);
                }
                _ = kill => {
                    signal_group(self.group, libc::SIGKILL);
                    kill_at = None;
                }
                _ = sigint.1.recv() => signal_group(self.group, sigint.0),
                _ = sigterm.1.recv() => signal_group(self.group, sigterm.0),
                _ = sighup.1.recv() => signal_group(self.group, sighup.0),
                _ = sigquit.1.recv() => signal_group(self.group, sigquit.0),
            }
        };
        stop_group(self.group, grace).await;
        Ok(Ended {
            status,
            lost: lost_reason,
        })
    }
}

/// The exit code that reports `status`: its code, or 128 + the signal.
pub(crate) fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code.clamp(0, 255)).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

fn signal_group(group: i32, sig: i32) {
    // SAFETY: signalling a process group we created; an empty group only errs.
    unsafe { libc::killpg(group, sig) };
}

/// Stops what is left of `group`: SIGTERM, SIGKILL after `grace`, then
/// waits until no process of it is left.
async fn stop_group(group: i32, grace: Duration) {
    // Signalled whether or not a scan sees a member: one scan can miss one.
    signal_group(group, libc::SIGTERM);
    let kill_at = Instant::now() + grace;
    // Gone only when three scans in a row, 10 ms apart, find nobody: one
    // scan of /proc can miss a member that is changing state under a busy
    // host, and a member left running outlives the lock.
    let mut empty_scans = 0;
    while empty_scans < 3 {
        if group_alive(group) {
            empty_scans = 0;
            if Instant::now() >= kill_at {
                signal_group(group, libc::SIGKILL);
            }
        } else {
            empty_scans += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether a live (not zombie) process of `group` is left.
#[cfg(target_os = "linux")]
fn group_alive(group: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return probe_group(group);
    };
    entries.filter_map(Result::ok).any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold anything, so read
        // after its last parenthesis.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|f| f.parse::<i32>().ok());
        pgrp == Some(group) && state != Some("Z") && state != Some("X")
    })
}

#[cfg(not(target_os = "linux"))]
fn group_alive(group: i32) -> bool {
    probe_group(group)
}

fn probe_group(group: i32) -> bool {
    // SAFETY: signal 0 only checks that the group exists.
    unsafe { libc::killpg(group, 0) == 0 }
}
