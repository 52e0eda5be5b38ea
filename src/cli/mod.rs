//! The `distlock` command line: arguments, the default lock file, and one
//! function per command. Each command that reaches the store ends with its
//! locker closed (`closing.rs`), on every exit path, and listens for the
//! signals that would end it (`signals.rs`) from before it connects.

mod closing;
mod exit;
mod hold;
mod inspect;
#[cfg(target_os = "linux")]
mod run;
mod signals;
mod store;
#[cfg(target_os = "linux")]
mod supervisor;
#[cfg(target_os = "linux")]
mod tree;
mod wire;

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::backend::Kind;
use distlock::{
    Access, FencingToken, HolderLabel, JobOutcome, LockBackend, LockError, LockName, Locker,
    MultiGuard, ReleaseOutcome,
};

use exit::Failure;
use hold::Hold;
use signals::Signals;
use store::{default_backend, default_path};

/// The hidden supervisor mode of `distlock run` (see `supervisor.rs`):
/// `Some(exit code)` when `args` start it. Checked before anything else
/// starts (no async runtime, no logging), so the supervisor stays one thread.
pub(crate) fn supervisor_mode(args: &[std::ffi::OsString]) -> Option<ExitCode> {
    if args.get(1)? != wire::SUPERVISOR_ARG {
        return None;
    }
    #[cfg(target_os = "linux")]
    return Some(supervisor::main(&args[2..]));
    #[cfg(not(target_os = "linux"))]
    return Some(ExitCode::from(exit::USAGE));
}

#[derive(Parser, Debug)]
#[command(
    name = "distlock",
    version,
    about = "Safe distributed locks from the shell",
    long_about = "Safe distributed locks from the shell.\n\n\
        Without --url, locks live in a SQLite file in your state directory \
        ($XDG_STATE_HOME/distlock/locks.db, else ~/.local/state/distlock/locks.db), \
        shared by every process of this host: two `distlock run NAME -- CMD` in two \
        shells never overlap. Use --url redis://..., postgres://..., etcd://... or zk://... \
        for locks between hosts.",
    after_help = exit::HELP
)]
struct Cli {
    /// Lock store URL: sqlite://PATH, redis://, rediss://, postgres://, etcd://, zk://,
    /// memory:// (this process only; see `distlock schemes`). Default: the SQLite file in
    /// your state directory.
    #[arg(long, env = "DISTLOCK_URL", hide_env_values = true)]
    url: Option<String>,
    /// Lease TTL, e.g. 30s, 500ms: how long a dead holder can block the name
    /// (on SQLite a dead holder's lock is free at once).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How long to wait for the lock.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    wait: Duration,
    #[command(subcommand)]
    command: Command,
}

/// How to take the lock, shared by `run` and `hold`.
#[derive(clap::Args, Debug)]
struct Take {
    /// Lock name.
    name: String,
    /// Fail at once (exit 75) if the lock is held, instead of waiting.
    #[arg(long)]
    no_wait: bool,
    /// Take one of N permits of a semaphore instead of a lock
    /// (DISTLOCK_SLOT tells which).
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    /// Take a read share of the reader-writer lock NAME instead of a lock:
    /// runs with --shared go side by side, never beside one with --exclusive
    /// (DISTLOCK_ACCESS=read). The reader-writer lock NAME is apart from the
    /// lock NAME.
    #[arg(long, conflicts_with_all = ["permits", "exclusive"])]
    shared: bool,
    /// Take the write of the reader-writer lock NAME: alone, and before any
    /// --shared run that asks after it (DISTLOCK_ACCESS=write).
    #[arg(long, conflicts_with = "permits")]
    exclusive: bool,
    /// Who holds it, shown by `inspect` (default: host:pid).
    #[arg(long)]
    label: Option<String>,
}

impl Take {
    /// The share of the reader-writer lock asked for, if any.
    fn access(&self) -> Option<Access> {
        match (self.shared, self.exclusive) {
            (true, _) => Some(Access::Read),
            (_, true) => Some(Access::Write),
            _ => None,
        }
    }
}

/// `run` as a run-once job (`--at-most`): on one node at a time, skipped
/// (exit 75, never waited for) while another run holds the name.
#[derive(clap::Args, Debug)]
struct Once {
    /// Run as a scheduled job: skip at once (exit 75) if another run holds
    /// NAME, and hold it at most this long (the command is then lost: SIGTERM,
    /// exit 4). Renewed on --ttl leases up to it, so a dead node frees NAME
    /// after one TTL (on SQLite, at once).
    #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration,
          conflicts_with_all = ["permits", "shared", "exclusive"])]
    at_most: Option<Duration>,
    /// With --at-most: when the command ends sooner, NAME stays taken until
    /// this long after it was granted, judged by the store's clock (never a
    /// node's), so no other node runs the job again in that window. Kept
    /// even after distlock exits.
    #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration,
          requires = "at_most")]
    at_least: Option<Duration>,
    /// With --at-most: hold one lease of --at-most, never renewed (a dead node
    /// then holds NAME for --at-most).
    #[arg(long, requires = "at_most")]
    no_renew: bool,
    /// With --at-most: once the command exits 0, record the run in the store
    /// (as the lock NAME#last-run) and skip every run (exit 76) that starts
    /// less than this long after its grant, judged by the store's clock. A
    /// failed run is not recorded. For an hourly job, a little under the hour.
    #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration,
          requires = "at_most")]
    once_per: Option<Duration>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding the lock. The command gets DISTLOCK_NAME and
    /// DISTLOCK_FENCE (and DISTLOCK_SLOT with --permits) in its environment and runs
    /// in its own process group under a supervisor process (Linux only), which kills
    /// the command and every process it started, even a daemon that called setsid:
    /// with SIGKILL within milliseconds if distlock dies (kill -9 and the OOM killer
    /// included), and at the lease's local deadline if distlock is stopped or hung.
    /// If the lease is lost, they get SIGTERM, then SIGKILL after --grace. SIGINT,
    /// SIGTERM, SIGHUP and SIGQUIT are forwarded to the group (while still waiting
    /// for the lock, they end distlock instead: exit 128 + the signal, nothing left
    /// queued); Ctrl-Z stops the
    /// command with distlock, and it continues only if the lease still holds (else it
    /// is killed: exit 4). The lock is released once no process of the command is
    /// left (on SQLite it stays taken until then, even if distlock died). If distlock
    /// and the supervisor are killed together, processes the command started may
    /// survive: what makes a late command harmless is the resource refusing its stale
    /// DISTLOCK_FENCE.
    ///
    /// With --at-most, a run-once scheduled job: never waits, skipped with exit 75
    /// while another run holds NAME; DISTLOCK_FENCE is the run's execution id, larger
    /// than every earlier run's; --at-least keeps NAME taken after a command that
    /// ended early, on the store's clock, even after distlock exits.
    Run {
        #[command(flatten)]
        take: Take,
        /// Time between SIGTERM and SIGKILL when the command must stop.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        grace: Duration,
        #[command(flatten)]
        once: Once,
        /// Also hold this lock (repeat for more): every name or none, taken in
        /// sorted order (two runs naming the same locks in other orders never
        /// deadlock), under one --wait. The command gets DISTLOCK_NAME_1 and
        /// DISTLOCK_FENCE_1 for the first, and so on; it is stopped as soon as
        /// any of them is lost.
        #[arg(long = "also", value_name = "NAME",
              conflicts_with_all = ["permits", "at_most", "shared", "exclusive"])]
        also: Vec<String>,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Campaign for leadership of NAME and run a command while leading, with
    /// DISTLOCK_TERM (the leader's fencing token) and DISTLOCK_NAME in its
    /// environment; stopped on loss like `run`.
    Elect {
        /// Election name.
        name: String,
        /// This candidate's label, shown to observers and by `inspect`.
        #[arg(long)]
        label: Option<String>,
        /// Time between SIGTERM and SIGKILL when the command must stop.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        grace: Duration,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Take the lock, print its fencing token, hold it for a while, release.
    Hold {
        #[command(flatten)]
        take: Take,
        /// How long to hold it (until interrupted: SIGINT, SIGTERM, SIGHUP or
        /// SIGQUIT release it, and distlock exits 128 + the signal).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        r#for: Duration,
    },
    /// Show who holds a lock (or a semaphore's permits, or a reader-writer
    /// lock's readers or writer).
    Inspect {
        /// Lock name.
        name: String,
        /// Print one JSON object (fence, owner, label, expires_in_ms).
        #[arg(long)]
        json: bool,
        /// Show the holders of the semaphore NAME instead.
        #[arg(long, conflicts_with = "rw")]
        permits: bool,
        /// Show the holders of the reader-writer lock NAME instead, each
        /// with its access (read or write).
        #[arg(long)]
        rw: bool,
    },
    /// Evict whoever holds a lock (audited; the next holder gets a larger fence).
    ForceRelease {
        /// Lock name.
        name: String,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: String,
        /// Evict only the holder with this fencing token (as `inspect`
        /// showed it), so a retry never evicts the next holder.
        #[arg(long)]
        fence: Option<u64>,
    },
    /// After restoring the store from a backup: make every fence handed out
    /// from now on, for every name, larger than FLOOR (take the largest fence
    /// any resource has seen, plus a margin). Never lowers anything.
    RaiseFenceFloor {
        /// The new floor.
        floor: u64,
    },
    /// List the URL schemes this build supports, and the default lock file.
    Schemes,
}

/// Parses the arguments and runs the command. From before it connects, the
/// signals that would end `distlock` are caught; once connected, whatever
/// the command's end, the locker is closed before the exit code is returned.
pub(crate) async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Schemes = cli.command {
        schemes();
        return ExitCode::SUCCESS;
    }
    let mut signals = match Signals::catch() {
        Ok(signals) => signals,
        Err(e) => {
            return Failure::Code(exit::STORE, format!("cannot catch signals: {e}")).report();
        }
    };
    let backend = match until(&mut signals, connect(cli.url.as_deref())).await {
        Ok(backend) => backend,
        // Nothing was connected: nothing to close.
        Err(failure) => return failure.report(),
    };
    let locker = Locker::from_arc(backend).ttl(cli.ttl).max_wait(cli.wait);
    let code = match dispatch(&locker, cli.command, &mut signals).await {
        Ok(code) => code,
        Err(failure) => failure.report(),
    };
    closing::close(&locker).await;
    code
}

fn schemes() {
    for (scheme, feature) in distlock::SCHEMES {
        println!("{scheme}://\t{feature}");
    }
    match default_path() {
        Ok(path) => println!("default:\t{}", store::url_of(&path)),
        Err(why) => println!("default:\tnone ({why})"),
    }
}

async fn connect(url: Option<&str>) -> Result<Arc<dyn LockBackend>, Failure> {
    Ok(match url {
        Some(url) => distlock::connect(url).await?,
        None => default_backend().await?,
    })
}

/// `work`'s result, unless a signal comes first: then `work` is dropped
/// (what it leaves to clean up is the locker's close's) and the signal ends
/// the command.
async fn until<T>(
    signals: &mut Signals,
    work: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    signals.until(work).await.map_err(Failure::Signal)?
}

async fn dispatch(
    locker: &Locker,
    command: Command,
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    match command {
        Command::Run {
            take,
            grace,
            once,
            also,
            command,
        } => run_locked(locker, (take, also), once, grace, &command, signals).await,
        Command::Elect {
            name,
            label,
            grace,
            command,
        } => elect(locker, &name, label, grace, &command, signals).await,
        Command::Hold { take, r#for } => hold(locker, take, r#for, signals).await,
        Command::Inspect {
            name,
            json,
            permits,
            rw,
        } => {
            let kind = match (permits, rw) {
                (true, _) => Kind::Semaphore,
                (_, true) => Kind::ReadWrite,
                _ => Kind::Lock,
            };
            until(signals, inspect::inspect(locker, &name, json, kind)).await
        }
        Command::ForceRelease {
            name,
            reason,
            fence,
        } => until(signals, force_release(locker, &name, &reason, fence)).await,
        Command::RaiseFenceFloor { floor } => {
            until(signals, raise_fence_floor(locker, floor)).await
        }
        Command::Schemes => unreachable!("handled before connecting"),
    }
}

async fn raise_fence_floor(locker: &Locker, floor: u64) -> Result<ExitCode, Failure> {
    let floor = FencingToken::new(floor)
        .ok_or_else(|| Failure::Code(exit::USAGE, "the floor must be at least 1".into()))?;
    distlock::admin::raise_fence_floor(&**locker.backend(), floor).await?;
    println!("every fence from now on is above {floor}");
    Ok(ExitCode::SUCCESS)
}

fn label(locker: Locker, label: Option<String>) -> Result<Locker, LockError> {
    Ok(match label {
        Some(label) => locker.label(HolderLabel::new(label)?),
        None => locker,
    })
}

/// A held lock or permit, whichever `take` asked for. A signal while
/// waiting drops the wait.
async fn take(
    locker: &Locker,
    take: &Take,
    signals: &mut Signals,
) -> Result<distlock::LockGuard, Failure> {
    let locker = label(locker.clone(), take.label.clone())?;
    if !take.no_wait {
        tracing::debug!(name = %take.name, wait = ?locker.get_max_wait(), "waiting for the lock");
    }
    let taking = async {
        let (name, no_wait) = (&take.name, take.no_wait);
        Ok::<_, Failure>(match (take.permits, take.access()) {
            (Some(n), _) => {
                let permits = locker.semaphore(name, n)?;
                match no_wait {
                    true => permits.try_acquire().await?,
                    false => Some(permits.acquire().await?),
                }
            }
            (None, Some(access)) => {
                let rw = locker.rw_lock(name)?;
                match (access, no_wait) {
                    (Access::Read, true) => rw.try_read().await?,
                    (Access::Read, false) => Some(rw.read().await?),
                    (Access::Write, true) => rw.try_write().await?,
                    (Access::Write, false) => Some(rw.write().await?),
                }
            }
            (None, None) if no_wait => locker.try_acquire(name).await?,
            (None, None) => Some(locker.acquire(name).await?),
        })
    };
    until(signals, taking)
        .await?
        .ok_or_else(|| Failure::Code(exit::BUSY, format!("{} is held (--no-wait)", take.name)))
}

/// The locks `take` and `also` name, all or none. A signal while waiting
/// drops the wait (and what it took).
async fn take_all(
    locker: &Locker,
    take: &Take,
    also: &[String],
    signals: &mut Signals,
) -> Result<MultiGuard, Failure> {
    let locker = label(locker.clone(), take.label.clone())?;
    let names: Vec<&String> = std::iter::once(&take.name).chain(also).collect();
    let taking = async {
        Ok::<_, Failure>(if take.no_wait {
            locker.try_acquire_all(names.iter().copied()).await?
        } else {
            Some(locker.acquire_all(names.iter().copied()).await?)
        })
    };
    until(signals, taking).await?.ok_or_else(|| {
        let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
        Failure::Code(
            exit::BUSY,
            format!("one of {} is held (--no-wait)", names.join(", ")),
        )
    })
}

fn describe(guard: &distlock::LockGuard) -> String {
    let mut said = format!("{} fence={}", guard.name(), guard.fencing_token());
    if let Some(slot) = guard.slot() {
        said.push_str(&format!(" slot={slot}"));
    }
    if let Some(access) = guard.access() {
        said.push_str(&format!(" access={access}"));
    }
    said
}

/// The hold `run` keeps while its command runs: a lock or permit, one run
/// of a job, or several locks (`--also`).
enum Holding {
    Lock(distlock::LockGuard),
    Job(distlock::JobRun),
    Locks(MultiGuard),
}

impl Holding {
    fn hold(&self) -> &dyn Hold {
        match self {
            Holding::Lock(guard) => guard,
            Holding::Job(run) => run.guard(),
            Holding::Locks(locks) => locks,
        }
    }

    /// The fence of `name`'s grant (`name`: one the hold was taken for).
    fn fence_of(&self, name: &str) -> FencingToken {
        match self {
            Holding::Lock(guard) => guard.fencing_token(),
            Holding::Job(run) => run.guard().fencing_token(),
            Holding::Locks(locks) => locks
                .fencing_token(name)
                .expect("every name given to take_all is a member"),
        }
    }

    /// What was acquired, for people.
    fn describe(&self) -> String {
        match self {
            Holding::Lock(guard) => describe(guard),
            Holding::Job(run) => describe(run.guard()),
            Holding::Locks(locks) => {
                let each: Vec<String> = locks
                    .fencing_tokens()
                    .iter()
                    .map(|(name, fence)| format!("{name} fence={fence}"))
                    .collect();
                each.join(", ")
            }
        }
    }

    /// The lock that was lost (for several, the first lost), with its fence.
    fn lost_lock(&self, name: &str) -> Result<(LockName, FencingToken), LockError> {
        if let Holding::Locks(locks) = self
            && let Some((lost, _)) = locks.loss()
            && let Some(fence) = locks.fencing_token(lost.as_str())
        {
            return Ok((lost, fence));
        }
        Ok((LockName::new(name)?, self.fence_of(name)))
    }

    /// Frees the name now: the command did not run.
    async fn release(self) -> Result<ReleaseOutcome, LockError> {
        match self {
            Holding::Lock(guard) => guard.release().await,
            Holding::Job(run) => run.release().await,
            Holding::Locks(locks) => release_all(locks).await,
        }
    }

    /// The command ran (and `succeeded`, or not): frees the name, or for a
    /// job records a run that succeeded (--once-per) and leaves the name
    /// taken until its --at-least. `NotHeld` if the store no longer held it.
    async fn end(self, succeeded: bool) -> Result<ReleaseOutcome, LockError> {
        match self {
            Holding::Lock(guard) => guard.release().await,
            Holding::Locks(locks) => release_all(locks).await,
            Holding::Job(run) => {
                let end = if succeeded {
                    run.end().await?
                } else {
                    run.failed().await?
                };
                Ok(match end {
                    distlock::HoldEnd::NotHeld => ReleaseOutcome::NotHeld,
                    _ => ReleaseOutcome::Released,
                })
            }
        }
    }
}

/// Releases every lock of `locks`: `NotHeld` if the store no longer held
/// any one of them.
async fn release_all(locks: MultiGuard) -> Result<ReleaseOutcome, LockError> {
    let outcomes = locks.release().await?;
    Ok(
        if outcomes.iter().all(|(_, o)| *o == ReleaseOutcome::Released) {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        },
    )
}

/// The lock `take` asks for, or with `--at-most`, one run of the job:
/// skipped (exit 75) if held.
async fn hold_for_run(
    locker: &Locker,
    (spec, also): (&Take, &[String]),
    once: &Once,
    signals: &mut Signals,
) -> Result<Holding, Failure> {
    if !also.is_empty() {
        return Ok(Holding::Locks(take_all(locker, spec, also, signals).await?));
    }
    let Some(at_most) = once.at_most else {
        return Ok(Holding::Lock(take(locker, spec, signals).await?));
    };
    let mut job = label(locker.clone(), spec.label.clone())?
        .job(&spec.name)?
        .at_most(at_most)
        .at_least(once.at_least.unwrap_or_default())
        .renew(!once.no_renew);
    if let Some(window) = once.once_per {
        job = job.once_per(window);
    }
    match until(signals, async { Ok(job.begin().await?) }).await? {
        JobOutcome::Ran(run) => Ok(Holding::Job(run)),
        JobOutcome::SkippedHeld { holder } => {
            let holder = holder.map_or(String::new(), |h| format!(" (fence {})", h.fence));
            Err(Failure::Code(
                exit::BUSY,
                format!("{} is held{holder}: skipped", spec.name),
            ))
        }
        JobOutcome::SkippedDone { last } => Err(Failure::Code(
            exit::DONE,
            format!(
                "{} already ran in this window{}: skipped",
                spec.name,
                last.map_or(String::new(), |l| format!(
                    " ({})",
                    inspect::describe_run(&l)
                ))
            ),
        )),
        _ => Err(Failure::Code(exit::BUSY, format!("{}: skipped", spec.name))),
    }
}

async fn run_locked(
    locker: &Locker,
    (spec, also): (Take, Vec<String>),
    once: Once,
    grace: Duration,
    command: &[String],
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    let holding = hold_for_run(locker, (&spec, &also), &once, signals).await?;
    if let Some(signal) = signals.pending().await {
        // Stopped as the lock came: the command never starts.
        let _ = holding.release().await;
        return Err(Failure::Signal(signal));
    }
    let fence = holding.fence_of(&spec.name);
    eprintln!("distlock: acquired {}", holding.describe());
    let mut env = vec![
        ("DISTLOCK_NAME".to_owned(), spec.name.clone()),
        ("DISTLOCK_FENCE".to_owned(), fence.to_string()),
    ];
    if let Holding::Lock(guard) = &holding
        && let Some(slot) = guard.slot()
    {
        env.push(("DISTLOCK_SLOT".to_owned(), slot.to_string()));
    }
    if let Holding::Lock(guard) = &holding
        && let Some(access) = guard.access()
    {
        env.push(("DISTLOCK_ACCESS".to_owned(), access.to_string()));
    }
    for (i, name) in also.iter().enumerate() {
        let fence = holding.fence_of(name);
        env.push((format!("DISTLOCK_NAME_{}", i + 1), name.clone()));
        env.push((format!("DISTLOCK_FENCE_{}", i + 1), fence.to_string()));
    }
    let (status, lost) = match supervised(command, &env, holding.hold(), grace, signals).await {
        Ok(ended) => ended,
        Err(failure) => {
            // Nothing of the job is left: free the lock now, not at its TTL.
            let _ = holding.release().await;
            return Err(failure);
        }
    };
    if let Some(reason) = lost {
        let (name, fence) = holding.lost_lock(&spec.name)?;
        drop(holding);
        return Err(LockError::Lost {
            name,
            fence,
            reason,
        }
        .into());
    }
    match holding.end(status.success()).await? {
        ReleaseOutcome::Released => Ok(ExitCode::from(exit::of_status(status))),
        ReleaseOutcome::NotHeld => Err(Failure::Code(
            exit::LOST,
            format!(
                "the lease on {} (fence {fence}) was gone before the command finished",
                spec.name
            ),
        )),
    }
}

/// Runs `command` under a supervisor while `guard` holds (see `run.rs`),
/// forwarding `signals` to it: its exit status, and why the lease was lost
/// if it was. On an error no process of the command is left.
#[cfg(target_os = "linux")]
async fn supervised(
    command: &[String],
    env: &[(String, String)],
    guard: &dyn Hold,
    grace: Duration,
    signals: &mut Signals,
) -> Result<(std::process::ExitStatus, Option<distlock::LossReason>), Failure> {
    let ended = run::spawn(command, env, guard, grace)?
        .supervise(guard, grace, signals)
        .await?;
    Ok((ended.status, ended.lost))
}

#[cfg(not(target_os = "linux"))]
async fn supervised(
    _command: &[String],
    _env: &[(String, String)],
    _guard: &dyn Hold,
    _grace: Duration,
    _signals: &mut Signals,
) -> Result<(std::process::ExitStatus, Option<distlock::LossReason>), Failure> {
    Err(Failure::Code(
        exit::USAGE,
        "`run` and `elect` need Linux: their supervisor keeps the command from outliving \
         distlock with Linux process control (a child subreaper, /proc)"
            .into(),
    ))
}

async fn elect(
    locker: &Locker,
    name: &str,
    candidate: Option<String>,
    grace: Duration,
    command: &[String],
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    let candidate = match candidate {
        Some(l) => HolderLabel::new(l)?,
        None => locker.get_label().clone(),
    };
    let election = locker.election(name)?;
    let leadership = until(signals, async { Ok(election.campaign(candidate).await?) }).await?;
    if let Some(signal) = signals.pending().await {
        let _ = leadership.resign().await;
        return Err(Failure::Signal(signal));
    }
    let term = leadership.term();
    eprintln!("distlock: leading {name} term={term}");
    let env = [
        ("DISTLOCK_NAME", name.to_owned()),
        ("DISTLOCK_TERM", term.to_string()),
        ("DISTLOCK_FENCE", term.to_string()),
    ]
    .map(|(k, v)| (k.to_owned(), v));
    let (status, lost) = match supervised(command, &env, leadership.guard(), grace, signals).await {
        Ok(ended) => ended,
        Err(failure) => {
            let _ = leadership.resign().await;
            return Err(failure);
        }
    };
    if let Some(reason) = lost {
        return Err(LockError::Lost {
            name: LockName::new(name)?,
            fence: term,
            reason,
        }
        .into());
    }
    match leadership.resign().await? {
        ReleaseOutcome::Released => Ok(ExitCode::from(exit::of_status(status))),
        ReleaseOutcome::NotHeld => Err(Failure::Code(
            exit::LOST,
            format!("the leadership of {name} (term {term}) was gone before the command finished"),
        )),
    }
}

/// Holds the lock for `duration`, or until a signal (then exits 128 + the
/// signal), releasing it either way.
async fn hold(
    locker: &Locker,
    spec: Take,
    duration: Duration,
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    let guard = take(locker, &spec, signals).await?;
    println!("acquired {}", describe(&guard));
    let code = tokio::select! {
        reason = guard.lost() => {
            return Err(LockError::Lost { name: guard.name(), fence: guard.fencing_token(), reason }.into());
        }
        signal = signals.recv() => ExitCode::from(u8::try_from(128 + signal).unwrap_or(255)),
        _ = tokio::time::sleep(duration) => ExitCode::SUCCESS,
    };
    match guard.release().await? {
        ReleaseOutcome::Released => {
            println!("released {}", spec.name);
            Ok(code)
        }
        ReleaseOutcome::NotHeld => Err(Failure::Code(
            exit::LOST,
            format!("{} was no longer held at release (lease lost)", spec.name),
        )),
    }
}

async fn force_release(
    locker: &Locker,
    name: &str,
    reason: &str,
    fence: Option<u64>,
) -> Result<ExitCode, Failure> {
    let name = LockName::new(name)?;
    let evicted = match fence {
        None => locker.force_release(&name, reason).await?,
        Some(fence) => {
            let fence = FencingToken::new(fence)
                .ok_or_else(|| Failure::Code(exit::USAGE, "--fence must be at least 1".into()))?;
            locker.force_release_if(&name, fence, reason).await?
        }
    };
    match (evicted, fence) {
        (Some(h), _) => println!("{name}: evicted holder with fence {}", h.fence),
        (None, None) => println!("{name}: was free"),
        (None, Some(f)) => println!("{name}: not held under fence {f}; nothing evicted"),
    }
    Ok(ExitCode::SUCCESS)
}
