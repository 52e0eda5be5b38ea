//! Running a command under a lock and really stopping it, through a
//! supervisor process (`supervisor.rs`) that outlives distlock just long
//! enough to kill what the job started.
//!
//! distlock starts the supervisor (its own binary again), tells it the
//! lease's local deadline several times per renewal, forwards SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT to the job's group, orders the job ended
//! (SIGTERM, SIGKILL after the grace) when the lease is lost, and on Ctrl-Z
//! (SIGTSTP) stops the job before stopping itself. The lock is released only
//! after the supervisor reports that no process of the job is left. If the
//! supervisor dies, distlock (a subreaper too, so the job's processes come
//! back to it) kills them itself and fails the run.
//!
//! What the run holds is one lease, or several (`--also`): the job lasts
//! while every one holds, and the earliest deadline is the supervisor's.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;
use std::time::Duration;

use distlock::{Lease, LossReason};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::exit::{self, Failure};
use super::hold::Hold;
use super::signals::Signals;
use super::tree;
use super::wire::{Order, Report, SUPERVISOR_ARG};

/// A command started under a supervisor.
pub(crate) struct Job {
    supervisor: std::process::Child,
    program: String,
    reports: Lines<BufReader<OwnedReadHalf>>,
    orders: OwnedWriteHalf,
    /// The job's process group, once the supervisor reported it.
    group: Option<i32>,
    /// Ctrl-Z, and the SIGCONT that ends the stop.
    tstp: Signal,
    cont: Signal,
}

/// How a supervised command ended.
pub(crate) struct Ended {
    /// The command's exit status.
    pub(crate) status: ExitStatus,
    /// Why the lock was lost while it ran, if it was.
    pub(crate) lost: Option<LossReason>,
}

/// Starts `command` with `env` under a supervisor, for as long as `guard`
/// holds (the deadline it is given comes from `guard`'s lease). `grace`
/// bounds how long what the command leaves behind may take to stop.
pub(crate) fn spawn(
    command: &[String],
    env: &[(String, String)],
    guard: &dyn Hold,
    grace: Duration,
) -> Result<Job, Failure> {
    let program = command
        .first()
        .ok_or_else(|| Failure::Code(exit::USAGE, "no command to run".into()))?
        .clone();
    let internal = |what: &str, e: io::Error| {
        Failure::Code(
            exit::SUPERVISOR,
            format!("cannot start the supervisor: {what}: {e}"),
        )
    };
    // SIGINT, SIGTERM, SIGHUP and SIGQUIT have been caught since before
    // distlock connected (`signals.rs`): one arriving between the spawn and
    // the first wait is forwarded then, not lost.
    let tstp = signal(SignalKind::from_raw(libc::SIGTSTP)).map_err(|e| internal("signals", e))?;
    let cont = signal(SignalKind::from_raw(libc::SIGCONT)).map_err(|e| internal("signals", e))?;
    // If the supervisor dies, the job's processes come back to distlock.
    tree::become_subreaper().map_err(|e| internal("subreaper", e))?;
    let (ours, theirs) =
        std::os::unix::net::UnixStream::pair().map_err(|e| internal("socket", e))?;
    let presence = presence_fds(guard).map_err(|e| internal("the lock file's presence file", e))?;
    let control = theirs.as_raw_fd();
    let kept: Vec<RawFd> = presence.iter().map(AsRawFd::as_raw_fd).collect();
    let kept_arg = if kept.is_empty() {
        "-".to_owned()
    } else {
        let fds: Vec<String> = kept.iter().map(ToString::to_string).collect();
        fds.join(",")
    };
    // /proc/self/exe: this very binary, even if its file was replaced since.
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("distlock")
        .arg(SUPERVISOR_ARG)
        .arg(control.to_string())
        .arg(kept_arg)
        .arg(grace.as_millis().to_string())
        .arg(deadline_of(guard).to_string())
        .arg("--")
        .args(command.iter().map(OsString::from))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    // SAFETY: fcntl is async-signal-safe; it clears close-on-exec on these
    // two descriptors in the child only.
    unsafe {
        cmd.pre_exec(move || {
            inherit(control)?;
            for &fd in &kept {
                inherit(fd)?;
            }
            Ok(())
        });
    }
    let supervisor = cmd.spawn().map_err(|e| internal("spawn", e))?;
    drop((theirs, presence));
    ours.set_nonblocking(true)
        .map_err(|e| internal("socket", e))?;
    let (reports, orders) = UnixStream::from_std(ours)
        .map_err(|e| internal("socket", e))?
        .into_split();
    Ok(Job {
        supervisor,
        program,
        reports: BufReader::new(reports).lines(),
        orders,
        group: None,
        tstp,
        cont,
    })
}

impl Job {
    /// Waits for the command while `guard` holds, relaying `signals` and job
    /// control. When the lease is lost, the job gets SIGTERM, then SIGKILL
    /// after `grace`; once the command exits, what it left is stopped the
    /// same way. Returns when no process of the job is left.
    pub(crate) async fn supervise(
        mut self,
        guard: &dyn Hold,
        grace: Duration,
        signals: &mut Signals,
    ) -> Result<Ended, Failure> {
        let lost_token = guard.lost_token();
        let lost = async {
            lost_token.cancelled().await;
            guard.loss_reason().unwrap_or(LossReason::DeadlinePassed)
        };
        tokio::pin!(lost);
        let mut heartbeat = tokio::time::interval(heartbeat_period(guard));
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut lost_reason = None;
        let mut status = None;
        let mut expired = false;
        loop {
            tokio::select! {
                line = self.reports.next_line() => {
                    let report = match line {
                        Ok(Some(line)) => Report::parse(&line),
                        Ok(None) | Err(_) => None,
                    };
                    match report {
                        Some(Report::Started(pid)) => self.group = Some(pid),
                        Some(Report::Exited(raw)) => status = Some(ExitStatus::from_raw(raw)),
                        Some(Report::Expired) => expired = true,
                        Some(Report::Done) => break,
                        Some(Report::SpawnFailed { not_found, why }) => {
                            self.wait_supervisor().await;
                            let code = if not_found { exit::NOT_FOUND } else { exit::CANNOT_EXECUTE };
                            return Err(Failure::Code(code, format!("cannot run {:?}: {why}", self.program)));
                        }
                        // End of file without `done`: the supervisor died.
                        None => return Err(self.supervisor_died().await),
                    }
                }
                reason = &mut lost, if lost_reason.is_none() => {
                    lost_reason = Some(reason);
                    self.order(Order::End(grace)).await;
                }
                _ = heartbeat.tick(), if lost_reason.is_none() => {
                    self.order(Order::Deadline(deadline_of(guard))).await;
                }
                signal = signals.recv() => self.order(Order::Signal(signal)).await,
                _ = self.tstp.recv() => {
                    if let Some(reason) = self.stop_with_job(guard, lost_reason.is_some()).await {
                        lost_reason = Some(reason);
                    }
                }
            }
        }
        self.wait_supervisor().await;
        let status = status.ok_or_else(|| {
            Failure::Code(
                exit::SUPERVISOR,
                "the supervisor ended without the command's status".into(),
            )
        })?;
        if expired && lost_reason.is_none() {
            lost_reason = Some(guard.loss_reason().unwrap_or(LossReason::DeadlinePassed));
        }
        Ok(Ended {
            status,
            lost: lost_reason,
        })
    }

    /// Ctrl-Z: stops the job, then distlock itself. On SIGCONT the job
    /// continues if the lease still holds; if it was lost meanwhile the job
    /// is killed instead, and the reason returned.
    async fn stop_with_job(&mut self, guard: &dyn Hold, ending: bool) -> Option<LossReason> {
        self.order(Order::Stop).await;
        // A SIGCONT from before this stop must not end it.
        while tokio::time::timeout(Duration::ZERO, self.cont.recv())
            .await
            .is_ok()
        {}
        // SAFETY: stopping ourselves, as the default action of SIGTSTP would.
        unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
        self.cont.recv().await;
        if ending {
            // Already ending: let it act on its SIGTERM.
            self.order(Order::Cont).await;
            None
        } else if guard.is_held() {
            self.order(Order::Deadline(deadline_of(guard))).await;
            self.order(Order::Cont).await;
            None
        } else {
            self.order(Order::Kill).await;
            Some(guard.loss_reason().unwrap_or(LossReason::DeadlinePassed))
        }
    }

    /// Sends `order`; a failure means the supervisor is gone, which the
    /// reports' end of file tells.
    async fn order(&mut self, order: Order) {
        let _ = self.orders.write_all(format!("{order}\n").as_bytes()).await;
    }

    async fn wait_supervisor(&mut self) -> Option<ExitStatus> {
        loop {
            match self.supervisor.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(_) => return None,
            }
        }
    }

    /// The supervisor died under the job: kill the job's group and every
    /// process left under distlock (orphans came back to it), until none is
    /// left, and say what happened.
    async fn supervisor_died(&mut self) -> Failure {
        let pid = self.supervisor.id();
        let how = match self.wait_supervisor().await {
            Some(status) => describe(status),
            None => "for an unknown reason".into(),
        };
        if let Some(group) = self.group {
            tree::signal_group(group, libc::SIGKILL);
        }
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        loop {
            if let Some(group) = self.group {
                tree::signal_group(group, libc::SIGKILL);
            }
            tree::signal_descendants(me, libc::SIGKILL);
            if tree::reap().1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Failure::Code(
            exit::SUPERVISOR,
            format!(
                "the supervisor process {pid} of {:?} {how}; the command and every process it started were killed",
                self.program
            ),
        )
    }
}

/// The earliest local deadline of `guard`'s leases on the boot clock, in
/// ns. The clock is read before the time left, so the result is never
/// later than the deadline.
fn deadline_of(guard: &dyn Hold) -> u64 {
    let now = tree::boot_now();
    let remaining = guard.leases().iter().map(Lease::remaining).min();
    let left = u64::try_from(remaining.unwrap_or_default().as_nanos()).unwrap_or(u64::MAX);
    now.saturating_add(left)
}

/// How often the supervisor hears the deadline: a twelfth of the shortest
/// TTL (a quarter of the default renew interval), between 10 ms and 1 s,
/// so a renewal's new deadline reaches it long before the old one passes.
fn heartbeat_period(guard: &dyn Hold) -> Duration {
    let ttl = guard.leases().iter().map(|l| l.ttl().get()).min();
    (ttl.unwrap_or_default() / 12).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The presence-file descriptors of SQLite grants, for the supervisor.
#[cfg(feature = "sqlite")]
fn presence_fds(guard: &dyn Hold) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    for lease in guard.leases() {
        fds.extend(lock_sqlite::presence_fd(&lease)?);
    }
    Ok(fds)
}

#[cfg(not(feature = "sqlite"))]
fn presence_fds(_guard: &dyn Hold) -> io::Result<Vec<OwnedFd>> {
    Ok(Vec::new())
}

/// Clears close-on-exec on `fd` (in the child between fork and exec).
fn inherit(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl has no memory arguments and is async-signal-safe.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => format!("ended ({status})"),
    }
}
