//! The supervisor: a small process between `distlock run` and its job, so
//! the job can never outlive distlock's hold on the lock.
//!
//! `distlock` re-executes its own binary in this mode (see
//! [`SUPERVISOR_ARG`](super::wire::SUPERVISOR_ARG)); it is single-threaded,
//! plain std and libc, and lives in a process group of its own, so a
//! terminal's Ctrl-C or Ctrl-Z and a `kill -PGID` of distlock's group do not
//! reach it. It:
//!
//! - is a child subreaper: every orphaned descendant of the job, even a
//!   double-forked `setsid` daemon, comes back to it, so it can find and kill
//!   the whole subtree;
//! - runs the job in a process group of its own, with a parent-death signal;
//! - kills every descendant (SIGKILL, again until none is left) the moment
//!   its socket to distlock reads end-of-file: the kernel closes distlock's
//!   end when distlock dies, `kill -9` and the OOM killer included;
//! - is a dead-man's switch: distlock sends the lease's local deadline on the
//!   boot clock (`CLOCK_BOOTTIME`, so a host suspend counts) several times
//!   per renewal; if that moment comes with no newer one (distlock stopped,
//!   hung, starved), it kills every descendant;
//! - carries out distlock's orders: forward a signal, stop or continue the
//!   subtree, end it (SIGTERM, SIGKILL after the grace) or kill it; what the
//!   job leaves behind when it exits gets the same SIGTERM and grace, with
//!   the dead-man's switch still armed;
//! - blocks SIGINT, SIGTERM, SIGHUP, SIGQUIT and the terminal's stop
//!   signals: those are the job's (`systemctl stop` sends SIGTERM to every
//!   process of a unit), and only SIGKILL ends the supervisor;
//! - on SQLite, holds a duplicate of each grant's presence-file descriptor
//!   (the same `flock`), so the locks stay taken while any process of the
//!   job is left, even after distlock died;
//! - reports the job's wait status, and exits only once it has no child left,
//!   which for a subreaper means no descendant left.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::Duration;

use super::tree;
use super::wire::{Order, Report};

/// How often the subtree is scanned again while it is being killed.
const RESCAN_MS: i32 = 10;

/// Runs the supervisor with the arguments after
/// [`SUPERVISOR_ARG`](super::wire::SUPERVISOR_ARG).
pub(crate) fn main(args: &[OsString]) -> ExitCode {
    match Setup::parse(args) {
        Some(setup) => match Supervisor::start(setup) {
            Ok(Some(supervisor)) => supervisor.run(),
            // The job could not start; distlock was told why and reports it.
            Ok(None) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("distlock: the supervisor cannot start: {e}");
                ExitCode::from(super::exit::SUPERVISOR)
            }
        },
        None => {
            eprintln!(
                "distlock: {} is internal to `distlock run`",
                super::wire::SUPERVISOR_ARG
            );
            ExitCode::from(super::exit::USAGE)
        }
    }
}

/// The supervisor's arguments: `CONTROL_FD PRESENCE_FD[,PRESENCE_FD...]|-
/// GRACE_MS DEADLINE_NS -- COMMAND...`.
struct Setup {
    control: RawFd,
    presence: Vec<RawFd>,
    grace: Duration,
    deadline: u64,
    command: Vec<OsString>,
}

impl Setup {
    fn parse(args: &[OsString]) -> Option<Setup> {
        let text = |i: usize| args.get(i)?.to_str();
        let control = text(0)?.parse().ok()?;
        let presence = match text(1)? {
            "-" => Vec::new(),
            fds => fds
                .split(',')
                .map(|fd| fd.parse().ok())
                .collect::<Option<_>>()?,
        };
        let grace = Duration::from_millis(text(2)?.parse().ok()?);
        let deadline = text(3)?.parse().ok()?;
        (text(4)? == "--").then_some(())?;
        let command = args.get(5..).filter(|c| !c.is_empty())?.to_vec();
        Some(Setup {
            control,
            presence,
            grace,
            deadline,
            command,
        })
    }
}

struct Supervisor {
    control: OwnedFd,
    /// The grants' presence files (SQLite): held, never read, until exit.
    _presence: Vec<OwnedFd>,
    sigchld: OwnedFd,
    timer: OwnedFd,
    me: i32,
    /// The job's pid, which is also its process group.
    job: i32,
    grace: Duration,
    /// The job's wait status, once it ended.
    status: Option<i32>,
    /// When to kill everything unless a newer deadline comes (boot ns).
    deadline: Option<u64>,
    /// When to SIGKILL what is left after a SIGTERM (boot ns).
    kill_at: Option<u64>,
    /// SIGTERM was sent to everything (the job ended, or the lease was lost).
    ending: bool,
    /// distlock said the lease is lost: deadlines no longer count, the
    /// grace does.
    lost: bool,
    /// SIGKILL everything, again until nothing is left.
    killing: bool,
    /// distlock's end of the socket is closed.
    orphaned: bool,
    /// Bytes of an order not yet ended by a newline.
    pending: Vec<u8>,
}

impl Supervisor {
    /// Sets up and starts the job; `None` when the job could not start
    /// (reported to distlock).
    fn start(setup: Setup) -> io::Result<Option<Supervisor>> {
        // SAFETY: the fds were passed to this process for it to own (their
        // close-on-exec flag cleared by distlock for this exec only).
        let control = unsafe { OwnedFd::from_raw_fd(setup.control) };
        let presence: Vec<OwnedFd> = setup
            .presence
            .into_iter()
            // SAFETY: as above.
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        // None is the job's: a job holding a presence file would keep its
        // lock taken; one holding the socket would hide distlock's death.
        set_cloexec(control.as_raw_fd())?;
        for p in &presence {
            set_cloexec(p.as_raw_fd())?;
        }
        set_nonblocking(control.as_raw_fd())?;
        // Shown by ps and top (the exec'd path, /proc/self/exe, would show "exe").
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"distlock-sup".as_ptr()) };
        tree::become_subreaper()?;
        shield()?;
        let sigchld = sigchld_fd()?;
        // SAFETY: timerfd_create has no memory arguments.
        let timer = unsafe {
            libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
        };
        if timer < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just created, owned here.
        let timer = unsafe { OwnedFd::from_raw_fd(timer) };
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let mut supervisor = Supervisor {
            control,
            _presence: presence,
            sigchld,
            timer,
            me,
            job: 0,
            grace: setup.grace,
            status: None,
            deadline: Some(setup.deadline),
            kill_at: None,
            ending: false,
            lost: false,
            killing: false,
            orphaned: false,
            pending: Vec::new(),
        };
        supervisor.job = match spawn_job(&setup.command, me) {
            Ok(pid) => pid,
            Err(e) => {
                supervisor.report(&Report::SpawnFailed {
                    not_found: e.kind() == io::ErrorKind::NotFound,
                    why: e.to_string(),
                });
                return Ok(None);
            }
        };
        supervisor.report(&Report::Started(supervisor.job));
        Ok(Some(supervisor))
    }

    fn run(mut self) -> ExitCode {
        loop {
            let (ended, none_left) = tree::reap();
            for (pid, status) in ended {
                if pid == self.job && self.status.is_none() {
                    self.status = Some(status);
                    self.report(&Report::Exited(status));
                    // What the job left behind is stopped like a lost job.
                    self.end(self.grace);
                }
            }
            if none_left {
                self.report(&Report::Done);
                return ExitCode::SUCCESS;
            }
            let now = tree::boot_now();
            if self.deadline.is_some_and(|d| now >= d) {
                self.deadline = None;
                self.killing = true;
                self.report(&Report::Expired);
            }
            if self.kill_at.is_some_and(|at| now >= at) {
                self.kill_at = None;
                self.killing = true;
            }
            if self.killing {
                tree::signal_group(self.job, libc::SIGKILL);
                tree::signal_descendants(self.me, libc::SIGKILL);
            }
            self.arm_timer();
            self.wait_for_events();
        }
    }

    /// Waits for an order, a child's end or the timer (or the next scan
    /// while killing), and handles what came.
    fn wait_for_events(&mut self) {
        let mut fds = [
            poll_fd(self.sigchld.as_raw_fd()),
            poll_fd(self.timer.as_raw_fd()),
            poll_fd(if self.orphaned {
                -1
            } else {
                self.control.as_raw_fd()
            }),
        ];
        let timeout = if self.killing { RESCAN_MS } else { -1 };
        // SAFETY: poll reads and writes our local array of three pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout) };
        if ready <= 0 {
            return;
        }
        drain(self.sigchld.as_raw_fd());
        drain(self.timer.as_raw_fd());
        if fds[2].revents != 0 {
            self.read_orders();
        }
    }

    fn read_orders(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: read into our local buffer, at most its length.
            let n =
                unsafe { libc::read(self.control.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                0 => return self.distlock_gone(),
                n if n > 0 => {
                    self.pending
                        .extend_from_slice(&buf[..usize::try_from(n).unwrap_or(0)]);
                    while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = self.pending.drain(..=end).collect();
                        let order = std::str::from_utf8(&line[..end])
                            .ok()
                            .and_then(Order::parse);
                        // An unreadable order is a bug: fail safe.
                        self.obey(order.unwrap_or(Order::Kill));
                    }
                }
                _ => match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EAGAIN) => return,
                    Some(libc::EINTR) => continue,
                    _ => return self.distlock_gone(),
                },
            }
        }
    }

    /// distlock died (or its socket broke): kill everything now.
    fn distlock_gone(&mut self) {
        self.orphaned = true;
        self.deadline = None;
        self.killing = true;
    }

    fn obey(&mut self, order: Order) {
        match order {
            Order::Deadline(at) => {
                if !self.lost && !self.killing {
                    self.deadline = Some(at);
                }
            }
            Order::Signal(sig) => tree::signal_group(self.job, sig),
            Order::Stop => self.signal_all(libc::SIGSTOP),
            Order::Cont => self.signal_all(libc::SIGCONT),
            Order::End(grace) => {
                // The lease is lost: from here the grace decides.
                self.lost = true;
                self.deadline = None;
                self.end(grace);
            }
            Order::Kill => {
                self.deadline = None;
                self.killing = true;
            }
        }
    }

    /// SIGTERM to everything (continued, so a stopped process can act on
    /// it), SIGKILL after `grace`. While the lease holds (what the job left
    /// behind when it exited), the dead-man's switch stays armed too: the
    /// earlier of the two kills.
    fn end(&mut self, grace: Duration) {
        let at =
            tree::boot_now().saturating_add(u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX));
        self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
        if !self.ending {
            self.ending = true;
            self.signal_all(libc::SIGTERM);
            self.signal_all(libc::SIGCONT);
        }
    }

    fn signal_all(&self, sig: i32) {
        tree::signal_group(self.job, sig);
        tree::signal_descendants(self.me, sig);
    }

    /// Sets the timer to the earliest of the deadline and the kill time.
    fn arm_timer(&self) {
        let at = [self.deadline, self.kill_at].into_iter().flatten().min();
        // Zero disarms; a moment already past fires at once.
        let at = at.map_or(0, |at| at.max(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: timerfd_settime reads our local itimerspec.
        unsafe {
            libc::timerfd_settime(
                self.timer.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
    }

    /// Tells distlock, if it still listens (a lost report is no harm: a
    /// dead distlock has nothing to do with it).
    fn report(&self, report: &Report) {
        if self.orphaned {
            return;
        }
        let line = format!("{report}\n");
        // SAFETY: send reads our local buffer; MSG_NOSIGNAL: no SIGPIPE.
        unsafe {
            libc::send(
                self.control.as_raw_fd(),
                line.as_ptr().cast(),
                line.len(),
                libc::MSG_NOSIGNAL,
            )
        };
    }
}

/// Starts the job in a process group of its own, with SIGKILL as its
/// parent-death signal. Returns its pid.
fn spawn_job(command: &[OsString], me: i32) -> io::Result<i32> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| io::Error::other("no command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args).process_group(0);
    // The job starts with no signal blocked: std does not clear the mask a
    // child inherits, and this process blocks SIGCHLD (read from its
    // signalfd) and the signals `shield` keeps from it.
    // SAFETY: sigemptyset only writes the local set.
    let empty = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        set
    };
    // SAFETY: sigprocmask, prctl and getppid are async-signal-safe; nothing
    // else runs between fork and exec. (std resets SIGPIPE.)
    unsafe {
        cmd.pre_exec(move || {
            if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != me {
                return Err(io::Error::other(
                    "the supervisor exited before the command started",
                ));
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // Reaped by the supervisor's own loop (waitpid(-1)), not through `child`.
    i32::try_from(child.id()).map_err(io::Error::other)
}

/// Blocks what is the job's or the terminal's, not the supervisor's:
/// SIGINT, SIGTERM, SIGHUP, SIGQUIT (`systemctl stop` sends SIGTERM to every
/// process of a unit; a supervisor ended by it would kill the job without
/// its grace) and SIGTSTP, SIGTTIN, SIGTTOU. Blocked, not ignored:
/// `spawn_job` clears the mask, an ignored disposition would be inherited.
/// SIGKILL still ends it, and distlock then kills the job itself.
fn shield() -> io::Result<()> {
    // SAFETY: plain libc calls on a local sigset; single-threaded here.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            libc::sigaddset(&mut set, sig);
        }
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A signalfd for SIGCHLD (blocked, so it is read there instead of handled),
/// SIGCHLD's disposition reset first: an ignored SIGCHLD, inherited across
/// exec, would make the kernel reap children behind our back.
fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: plain libc calls on a local sigset; single-threaded here.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

fn poll_fd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Reads a nonblocking descriptor (signalfd, timerfd) until it is empty.
fn drain(fd: RawFd) {
    let mut buf = [0u8; 512];
    // SAFETY: read into our local buffer, at most its length.
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory arguments.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory arguments.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
