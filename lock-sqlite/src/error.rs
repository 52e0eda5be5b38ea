//! sqlx and file-system errors mapped to `LockError`: retryable
//! (`Unavailable`) or not (`Store`).

use lockcore::LockError;
use std::io;
use std::path::Path;

pub(crate) const BACKEND: &str = "sqlite";

/// SQLite's primary result codes this crate tells apart.
pub(crate) mod code {
    pub(crate) const BUSY: i64 = 5;
    pub(crate) const LOCKED: i64 = 6;
    pub(crate) const READONLY: i64 = 8;
    pub(crate) const IOERR: i64 = 10;
    pub(crate) const FULL: i64 = 13;
    pub(crate) const CANTOPEN: i64 = 14;
    pub(crate) const PROTOCOL: i64 = 15;
    pub(crate) const NOTADB: i64 = 26;
}

/// The primary SQLite result code of `error`, if it is a database error.
pub(crate) fn primary_code(error: &sqlx::Error) -> Option<i64> {
    match error {
        sqlx::Error::Database(db) => db.code()?.parse::<i64>().ok().map(|c| c & 0xff),
        _ => None,
    }
}

/// Maps a sqlx error by what retrying can fix: another process holding the
/// file's write lock past the timeout, a full disk or an I/O error may pass;
/// a read-only or corrupt file will not.
pub(crate) fn map(error: sqlx::Error) -> LockError {
    use sqlx::Error as E;
    match primary_code(&error) {
        Some(code::BUSY | code::LOCKED | code::IOERR | code::FULL | code::PROTOCOL) => {
            return LockError::unavailable(BACKEND, error);
        }
        Some(_) => return LockError::store(BACKEND, error),
        None => {}
    }
    match &error {
        E::Configuration(_) => LockError::config_caused_by("invalid SQLite settings", error),
        E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => {
            LockError::unavailable(BACKEND, error)
        }
        _ => LockError::store(BACKEND, error),
    }
}

/// A file-system error around the lock file (its directory, presence files).
pub(crate) fn io(what: &str, error: io::Error) -> LockError {
    LockError::store(
        BACKEND,
        io::Error::new(error.kind(), format!("{what}: {error}")),
    )
}

/// `path` as errors, logs and `Debug` show it: the `sqlite://` URL it
/// stands for, through the one redaction of distlock, so nothing shows more
/// of it than `redact_url` of that URL would.
pub(crate) fn shown(path: &Path) -> String {
    lockcore::backend::redact_url(&format!("sqlite://{}", path.display()))
}

/// A row that breaks the table's invariants (someone edited it by hand).
pub(crate) fn corrupt(what: impl Into<String>) -> LockError {
    LockError::store(BACKEND, what.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_errors_are_retryable_and_others_not() {
        assert!(map(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!map(sqlx::Error::RowNotFound).is_retryable());
        assert!(!corrupt("bad row").is_retryable());
    }
}
