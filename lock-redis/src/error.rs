//! Maps client errors onto [`LockError`]: transient trouble is
//! `Unavailable` (safe to retry: every operation is owner-checked), anything
//! retrying cannot fix is `Store`.

use lockcore::LockError;
use redis::{ErrorKind, RedisError, RetryMethod};

pub(crate) const BACKEND: &str = "redis";

/// Codes the server sends for conditions that pass: a script running too
/// long, a dataset being loaded after a restart, a failover in progress, a
/// `noeviction` server out of memory (it refuses writes until there is room).
const TRANSIENT_CODES: &[&str] = &[
    "BUSY",
    "LOADING",
    "TRYAGAIN",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "OOM",
];

/// Codes that mean the credentials or their rights are wrong.
const AUTH_CODES: &[&str] = &["NOAUTH", "WRONGPASS", "NOPERM"];

pub(crate) fn map(e: RedisError) -> LockError {
    let code = e.code().map(str::to_owned);
    if e.kind() == ErrorKind::AuthenticationFailed
        || code.as_deref().is_some_and(|c| AUTH_CODES.contains(&c))
    {
        return LockError::store(BACKEND, e);
    }
    if e.kind() == ErrorKind::InvalidClientConfig {
        return LockError::config_caused_by("invalid Redis client configuration", e);
    }
    // A TLS handshake that failed on the certificate (unknown issuer, wrong
    // host name) surfaces as InvalidData: retrying will not fix it.
    if io_error(&e).is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData) {
        return LockError::store(BACKEND, e);
    }
    if code
        .as_deref()
        .is_some_and(|c| TRANSIENT_CODES.contains(&c))
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
    {
        return LockError::unavailable(BACKEND, e);
    }
    match e.retry_method() {
        RetryMethod::NoRetry => LockError::store(BACKEND, e),
        _ => LockError::unavailable(BACKEND, e),
    }
}

/// The I/O error inside a client error, if that is what it wraps.
fn io_error(e: &RedisError) -> Option<&std::io::Error> {
    let source = std::error::Error::source(e)?;
    source.downcast_ref::<std::io::Error>().or_else(|| {
        source
            .downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()?
            .downcast_ref::<std::io::Error>()
    })
}

/// An operation that got no answer within the configured time.
pub(crate) fn timed_out(what: &str, after: std::time::Duration) -> LockError {
    LockError::unavailable(
        BACKEND,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what}: no answer within {after:?}"),
        ),
    )
}

/// A reply the scripts never produce: a key that holds something else, or
/// another program writing under our prefix.
pub(crate) fn unexpected(what: impl Into<String>) -> LockError {
    LockError::store(
        BACKEND,
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.into()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_retryable_and_auth_errors_are_not() {
        let io: RedisError =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused").into();
        assert!(map(io).is_retryable());
        let auth: RedisError = (ErrorKind::AuthenticationFailed, "bad password").into();
        assert!(matches!(map(auth), LockError::Store { .. }));
        let config: RedisError = (ErrorKind::InvalidClientConfig, "bad url").into();
        assert!(matches!(map(config), LockError::InvalidConfig { .. }));
        let tls: RedisError =
            std::io::Error::new(std::io::ErrorKind::InvalidData, "invalid peer certificate").into();
        assert!(matches!(map(tls), LockError::Store { .. }));
        assert!(timed_out("acquire", std::time::Duration::from_secs(1)).is_retryable());
        assert!(!unexpected("x").is_retryable());
    }
}
