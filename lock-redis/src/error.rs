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
    match classify(&e) {
        Class::Store => LockError::store(BACKEND, e),
        Class::Unavailable => LockError::unavailable(BACKEND, e),
        Class::Config => LockError::config_caused_by("invalid Redis client configuration", e),
    }
}

/// Which [`LockError`] a client error becomes.
enum Class {
    Store,
    Unavailable,
    Config,
}

fn classify(e: &RedisError) -> Class {
    let code = e.code();
    if e.kind() == ErrorKind::AuthenticationFailed || code.is_some_and(|c| AUTH_CODES.contains(&c))
    {
        return Class::Store;
    }
    if e.kind() == ErrorKind::InvalidClientConfig {
        return Class::Config;
    }
    // A TLS handshake that failed on the certificate (unknown issuer, wrong
    // host name) surfaces as InvalidData: retrying will not fix it.
    if io_error(e).is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData) {
        return Class::Store;
    }
    if code.is_some_and(|c| TRANSIENT_CODES.contains(&c))
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
    {
        return Class::Unavailable;
    }
    match e.retry_method() {
        RetryMethod::NoRetry => Class::Store,
        _ => Class::Unavailable,
    }
}

/// A failed connect: the server, the cause in words, and the client error.
#[derive(Debug)]
struct ConnectError {
    endpoint: String,
    cause: String,
    source: Option<RedisError>,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "connect to {}: {}", self.endpoint, self.cause)
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

/// A client error while connecting to `endpoint`: classified as by
/// [`map`], and saying which server and what went wrong.
pub(crate) fn at_connect(endpoint: &str, e: RedisError) -> LockError {
    let code = e.code().map(str::to_owned);
    let cause = if e.is_connection_refusal() {
        "connection refused: nothing listens there".to_owned()
    } else if code.as_deref() == Some("NOAUTH") {
        "the server requires a password and none was given".to_owned()
    } else if e.kind() == ErrorKind::AuthenticationFailed || code.as_deref() == Some("WRONGPASS") {
        "authentication failed: wrong user name or password".to_owned()
    } else if code.as_deref() == Some("NOPERM") {
        format!("the user may not do this: {e}")
    } else if io_error(&e).is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData) {
        format!("TLS handshake failed: {e}")
    } else if endpoint.starts_with("redis://") && closed_at_once(&e) {
        format!("the server closed the connection at once ({e}): a TLS-only port needs rediss://")
    } else {
        e.to_string()
    };
    let class = classify(&e);
    let failed = ConnectError {
        endpoint: endpoint.to_owned(),
        cause,
        source: Some(e),
    };
    match class {
        Class::Store => LockError::store(BACKEND, failed),
        Class::Unavailable => LockError::unavailable(BACKEND, failed),
        Class::Config => LockError::config_caused_by("invalid Redis client configuration", failed),
    }
}

/// Whether the server hung up on a new connection: what a TLS-only port
/// does with plain text.
fn closed_at_once(e: &RedisError) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    e.is_connection_dropped()
        || io_error(e).is_some_and(|io| {
            matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            )
        })
}

/// What a plain TCP connect found, to explain a connect that ran out of time.
#[derive(Debug)]
pub(crate) enum TcpProbe {
    /// The port accepts connections.
    Accepted,
    /// Connection refused.
    Refused,
    /// No answer at all.
    Silent,
    /// Another failure (host unreachable, no route, DNS).
    Failed(std::io::Error),
    /// Not probed (a Unix socket) or the probe did not finish.
    Unknown,
}

/// A connect to `endpoint` that did not finish within `after`, with what a
/// plain TCP connect found meanwhile.
pub(crate) fn connect_timed_out(
    endpoint: &str,
    after: std::time::Duration,
    tls: bool,
    found: TcpProbe,
) -> LockError {
    let cause = match found {
        TcpProbe::Accepted if tls => format!(
            "the port accepts TCP connections, but no TLS handshake finished within {after:?}: \
             it probably serves plain-text Redis (then use redis://), or the server is stalled"
        ),
        TcpProbe::Accepted => format!(
            "the port accepts TCP connections, but the server did not answer within {after:?}: \
             it is stalled (paused, overloaded, loading its data) or is not a Redis server"
        ),
        TcpProbe::Refused => "connection refused: nothing listens there".to_owned(),
        TcpProbe::Silent => format!(
            "no answer at all within {after:?}: the host is down or unreachable, or a firewall \
             drops the packets"
        ),
        TcpProbe::Failed(e) => format!("no connection within {after:?}: {e}"),
        TcpProbe::Unknown => format!("no connection within {after:?}"),
    };
    LockError::unavailable(
        BACKEND,
        ConnectError {
            endpoint: endpoint.to_owned(),
            cause,
            source: None,
        },
    )
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
