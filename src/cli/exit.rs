//! Exit codes and the one-line error report.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};

use distlock::LockError;

/// The exit codes of `distlock`, also listed in `--help` and the README.
pub(crate) const HELP: &str = "\
Exit codes:
  0    success (run, elect: the command exited 0)
  1    the store refused a request (an error retrying will not fix)
  2    usage: bad arguments, lock name, TTL, label or URL
  3    timed out waiting for the lock (--wait)
  4    the lease was lost (expired, evicted, --at-most passed) while the
       command ran
  69   the store is unavailable (unreachable, or did not answer in time)
  70   run, elect: the supervisor process died; the command was killed
  75   busy: the lock is held and --no-wait was given (as `flock -E 75`);
       run --at-most: skipped, another run of the job holds it
  76   run --once-per: skipped, a run already completed in this window
  126  the command cannot be executed; 127: not found
  N    run, elect: the command's own exit code; 128+S if it died of signal S
  128+S  stopped by SIGINT, SIGTERM, SIGHUP or SIGQUIT (S) while connecting,
         waiting for the lock or holding it (hold): what it queued or held is
         let go first (run, elect forward them to the running command)";

pub(crate) const STORE: u8 = 1;
pub(crate) const USAGE: u8 = 2;
pub(crate) const TIMED_OUT: u8 = 3;
pub(crate) const LOST: u8 = 4;
pub(crate) const UNAVAILABLE: u8 = 69;
/// Internal: `run`'s supervisor process died (or could not start).
pub(crate) const SUPERVISOR: u8 = 70;
pub(crate) const BUSY: u8 = 75;
/// `run --once-per`: a run already completed in this window.
pub(crate) const DONE: u8 = 76;
pub(crate) const CANNOT_EXECUTE: u8 = 126;
pub(crate) const NOT_FOUND: u8 = 127;

/// What ends a command early: a lock error, a plain failure with its code,
/// or a caught signal (exit 128 + the signal).
#[derive(Debug)]
pub(crate) enum Failure {
    Lock(LockError),
    Code(u8, String),
    Signal(i32),
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure::Lock(e)
    }
}

impl Failure {
    /// Prints the failure as one line on stderr and gives its exit code.
    pub(crate) fn report(self) -> ExitCode {
        let (code, message) = match self {
            Failure::Code(code, message) => (code, message),
            Failure::Lock(e) => (code_of(&e), one_line(&e)),
            Failure::Signal(signal) => (
                u8::try_from(128 + signal).unwrap_or(255),
                format!("stopped by {}", super::signals::name(signal)),
            ),
        };
        eprintln!("distlock: {message}");
        ExitCode::from(code)
    }
}

fn code_of(e: &LockError) -> u8 {
    match e {
        LockError::Timeout { .. } => TIMED_OUT,
        LockError::Lost { .. } | LockError::NotHeld { .. } => LOST,
        LockError::Unavailable { .. } => UNAVAILABLE,
        LockError::InvalidName { .. }
        | LockError::InvalidTtl { .. }
        | LockError::InvalidTimeout { .. }
        | LockError::InvalidLabel { .. }
        | LockError::InvalidConfig { .. }
        | LockError::PermitsMismatch { .. } => USAGE,
        _ => STORE,
    }
}

/// The error and the causes its message does not already show, on one line.
pub(crate) fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The exit code that reports a command's `status`: its code, or 128 + the
/// signal.
pub(crate) fn of_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code.clamp(0, 255)).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}
