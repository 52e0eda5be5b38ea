//! The one error type of distlock.

use std::fmt;
use std::time::Duration;

use crate::{FencingToken, LockName};

/// A boxed error from a store client: what [`LockError`]'s constructors take.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The `source` a [`LockError`] keeps: shared, so the error is [`Clone`] (a
/// batch answer can repeat one store failure for every lease in it).
pub type SharedError = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong, grouped by what the caller should do about it.
///
/// - fix the input: [`InvalidName`](Self::InvalidName),
///   [`InvalidTtl`](Self::InvalidTtl), [`InvalidTimeout`](Self::InvalidTimeout),
///   [`InvalidLabel`](Self::InvalidLabel), [`InvalidConfig`](Self::InvalidConfig);
/// - stop acting as the holder: [`NotHeld`](Self::NotHeld), [`Lost`](Self::Lost);
/// - try again later: [`Timeout`](Self::Timeout), [`Unavailable`](Self::Unavailable)
///   (see [`is_retryable`](Self::is_retryable));
/// - give up: [`Cancelled`](Self::Cancelled), [`Store`](Self::Store),
///   [`Unsupported`](Self::Unsupported).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock name is not valid (see [`LockName`]).
    #[error("invalid lock name \"{name}\": {reason}")]
    InvalidName {
        /// A short, escaped preview of the rejected name.
        name: String,
        /// Why it was rejected.
        reason: InvalidName,
    },

    /// The TTL is outside what the backend enforces (see
    /// [`Capabilities`](crate::Capabilities)).
    #[error("invalid TTL {ttl:?}: {reason}")]
    InvalidTtl {
        /// The rejected TTL.
        ttl: Duration,
        /// Why, with the accepted range.
        reason: String,
    },

    /// A wait or timeout that cannot be honoured (for example one that
    /// overflows the clock).
    #[error("invalid timeout {timeout:?}: {reason}")]
    InvalidTimeout {
        /// The rejected timeout.
        timeout: Duration,
        /// Why.
        reason: String,
    },

    /// The holder label is not valid (see [`HolderLabel`](crate::HolderLabel)).
    #[error("invalid holder label \"{label}\": {reason}")]
    InvalidLabel {
        /// A short, escaped preview of the rejected label.
        label: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A configuration value (URL, prefix, table name, credentials...) is not valid.
    #[error("invalid configuration: {message}")]
    InvalidConfig {
        /// What to fix.
        message: String,
        /// The underlying parse error, if any.
        #[source]
        source: Option<SharedError>,
    },

    /// The store does not hold this lease for this owner: it expired, was
    /// released, or was taken by someone else. Nothing was changed.
    #[error("lock \"{name}\" is not held by this owner")]
    NotHeld {
        /// The lock.
        name: LockName,
    },

    /// The lease was lost while held; the critical section must stop.
    #[error("lease on \"{name}\" (fence {fence}) was lost: {reason}")]
    Lost {
        /// The lock.
        name: LockName,
        /// The fencing token of the lost grant.
        fence: FencingToken,
        /// How it was lost.
        reason: LossReason,
    },

    /// The lock was not acquired within the wait.
    #[error("timed out after {waited:?} waiting for lock \"{name}\"")]
    Timeout {
        /// The lock.
        name: LockName,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The acquire was cancelled by the caller's cancellation token.
    #[error("acquire of lock \"{name}\" was cancelled")]
    Cancelled {
        /// The lock.
        name: LockName,
    },

    /// The store could not be reached or did not answer in time. Retrying is
    /// safe: every operation is owner-checked.
    #[error("{backend} is unavailable: {source}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// The client error.
        #[source]
        source: SharedError,
    },

    /// The store answered with an error that retrying will not fix
    /// (authentication, permission, an unexpected reply).
    #[error("{backend} refused the request: {source}")]
    Store {
        /// Which backend.
        backend: &'static str,
        /// The client or server error.
        #[source]
        source: SharedError,
    },

    /// The semaphore is kept with another number of permits: every holder of
    /// one name must agree on it.
    #[error("semaphore \"{name}\" has {existing} permits, this request asked for {requested}")]
    PermitsMismatch {
        /// The semaphore.
        name: LockName,
        /// The number this request gave.
        requested: u32,
        /// The number the store keeps.
        existing: u32,
    },

    /// The backend cannot do this.
    #[error("{operation} is not supported by {backend}")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What was asked.
        operation: &'static str,
    },
}

impl LockError {
    /// Whether the same call may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LockError::Unavailable { .. } | LockError::Timeout { .. }
        )
    }

    /// A transient store failure (network, timeout, failover).
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Unavailable {
            backend,
            source: SharedError::from(source.into()),
        }
    }

    /// A permanent store failure (auth, permission, protocol).
    pub fn store(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Store {
            backend,
            source: SharedError::from(source.into()),
        }
    }

    /// A configuration error without an underlying cause.
    pub fn config(message: impl Into<String>) -> Self {
        LockError::InvalidConfig {
            message: message.into(),
            source: None,
        }
    }

    /// A configuration error caused by `source`.
    pub fn config_caused_by(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        LockError::InvalidConfig {
            message: message.into(),
            source: Some(SharedError::from(source.into())),
        }
    }
}

/// Why a name was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidName {
    /// The name is empty.
    Empty,
    /// The name is longer than [`LockName::MAX_BYTES`].
    TooLong {
        /// Its length.
        bytes: usize,
    },
    /// The name contains a control character.
    ControlCharacter {
        /// Byte offset.
        at: usize,
        /// The code point.
        code: u32,
    },
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidName::Empty => f.write_str("names must not be empty"),
            InvalidName::TooLong { bytes } => {
                write!(
                    f,
                    "{bytes} bytes, names are at most {} bytes of UTF-8",
                    LockName::MAX_BYTES
                )
            }
            InvalidName::ControlCharacter { at, code } => {
                write!(
                    f,
                    "control character U+{code:04X} at byte {at} (control characters are not allowed)"
                )
            }
        }
    }
}

/// How a held lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The store refused a renewal: the lease expired or was taken.
    RenewalRefused,
    /// No renewal was answered before the local deadline.
    RenewalUnanswered,
    /// The local deadline passed (auto-renew off, or renewals kept failing).
    DeadlinePassed,
    /// The store reported the loss (session expired, keep-alive refused).
    StoreReported,
    /// A renewal failed with an error that retrying cannot fix.
    RenewalFailed(String),
    /// The guard was held longer than the locker's
    /// [`max_hold`](crate::Locker::max_hold).
    MaxHoldExceeded,
    /// The client was closed ([`Locker::close`](crate::Locker::close),
    /// [`LockBackend::close`](crate::LockBackend::close)) while the guard
    /// was held.
    Closed,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::RenewalRefused => {
                f.write_str("the store refused the renewal (expired or taken)")
            }
            LossReason::RenewalUnanswered => {
                f.write_str("no renewal was answered before the lease deadline")
            }
            LossReason::DeadlinePassed => f.write_str("the lease deadline passed"),
            LossReason::StoreReported => f.write_str("the store reported the lease gone"),
            LossReason::RenewalFailed(why) => write!(f, "renewal failed: {why}"),
            LossReason::MaxHoldExceeded => f.write_str("held longer than the locker's max_hold"),
            LossReason::Closed => f.write_str("the client was closed"),
        }
    }
}
