//! What a case returns: passed, skipped (and why) or failed (with the
//! evidence), and the `ensure!` / `skip!` macros that produce it.

use std::fmt;

use lockcore::LockError;

use crate::kit::poll::TimedOut;

/// A case that ran to the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// Not applicable to this backend (or harness); the reason says why.
    Skipped(String),
}

/// Why a case failed: which guarantee broke, with the evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl Failure {
    /// A failure with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Failure(message.into())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure(format!("unexpected error: {e} ({e:?})"))
    }
}

impl From<TimedOut> for Failure {
    fn from(e: TimedOut) -> Self {
        Failure(e.to_string())
    }
}

/// The result of one case.
pub type CaseResult = Result<Outcome, Failure>;

/// Fails the case with a formatted message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure::new(format!($($msg)+)));
        }
    };
}

/// Skips the case with a formatted reason.
#[macro_export]
macro_rules! skip {
    ($($msg:tt)+) => {
        return Ok($crate::Outcome::Skipped(format!($($msg)+)))
    };
}
