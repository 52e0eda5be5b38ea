//! sqlx errors mapped to `LockError`: retryable (`Unavailable`) or not (`Store`).

use std::time::Duration;

use lockcore::LockError;

pub(crate) const BACKEND: &str = "postgres";

/// Maps a sqlx error by what retrying can fix.
pub(crate) fn map(error: sqlx::Error) -> LockError {
    use sqlx::Error as E;
    match &error {
        E::Configuration(_) => {
            LockError::config_caused_by("invalid PostgreSQL connection settings", error)
        }
        // sqlx reports a refused server certificate as an I/O error of kind
        // InvalidData: a wrong CA or host name, which retrying cannot fix.
        E::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
            LockError::store(BACKEND, error)
        }
        E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed | E::Protocol(_) => {
            LockError::unavailable(BACKEND, error)
        }
        E::Database(db) if db.code().as_deref().is_some_and(retryable_sqlstate) => {
            LockError::unavailable(BACKEND, error)
        }
        _ => LockError::store(BACKEND, error),
    }
}

/// SQLSTATEs a later attempt may not hit: connection exceptions (08),
/// serialization failures and deadlocks (40), insufficient resources (53,
/// e.g. too many connections), operator intervention (57: shutdown,
/// restart, statement cancelled), lock not available (55P03), system I/O
/// errors (58).
fn retryable_sqlstate(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "40" | "53" | "57" | "58")) || code == "55P03"
}

/// A failed connection attempt to `server`, saying why (refused, reset,
/// authentication, a missing database...), classified as `map` does.
pub(crate) fn connecting(server: &str, error: sqlx::Error) -> LockError {
    let context = format!("connecting to {server}: {error}");
    match map(error) {
        LockError::Unavailable { .. } => LockError::unavailable(BACKEND, context),
        LockError::Store { .. } => LockError::store(BACKEND, context),
        other => other,
    }
}

/// The error for an operation that got no answer in time.
pub(crate) fn timed_out(what: &str, after: Duration) -> LockError {
    LockError::unavailable(
        BACKEND,
        format!("{what} got no answer from PostgreSQL within {after:?}"),
    )
}

/// A reply that breaks the table's invariants (someone edited it by hand).
pub(crate) fn corrupt(what: impl Into<String>) -> LockError {
    LockError::store(BACKEND, what.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified() {
        for code in [
            "08006", "40001", "40P01", "53300", "57P01", "57014", "55P03",
        ] {
            assert!(retryable_sqlstate(code), "{code}");
        }
        for code in ["28P01", "42501", "42P01", "23505", "22P02", "3D000", ""] {
            assert!(!retryable_sqlstate(code), "{code}");
        }
        assert!(map(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!map(sqlx::Error::RowNotFound).is_retryable());
        let refused = std::io::Error::new(std::io::ErrorKind::InvalidData, "bad certificate");
        assert!(!map(sqlx::Error::Io(refused)).is_retryable());
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(map(sqlx::Error::Io(reset)).is_retryable());
    }
}
