//! ZooKeeper client errors as `LockError`s.

use std::fmt;

use lockcore::{Lease, LockError, LockName};
use zookeeper_client as zk;

pub(crate) const BACKEND: &str = "zookeeper";

/// A client error with what we were doing.
#[derive(Debug)]
pub(crate) struct ZkError {
    what: String,
    source: zk::Error,
}

impl fmt::Display for ZkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)?;
        if self.source == zk::Error::NoAuth {
            f.write_str(
                " (the node's ACL belongs to another identity: check the digest credentials)",
            )?;
        }
        if self.source == zk::Error::AuthFailed {
            f.write_str(
                " (the servers refused this client's authentication: check the user and \
                 password, and that auth= names the scheme the servers expect: sasl for \
                 servers that require SASL, digest otherwise)",
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ZkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Whether the connection broke under a request, so its outcome is unknown:
/// the client fails in-flight requests with the error that broke the
/// connection (`ConnectionLoss`, or its own "no response" and I/O errors,
/// which it reports as `Custom`). Server replies are never `Custom`.
pub(crate) fn connection_lost(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// Whether retrying (on this or a fresh session) may succeed.
pub(crate) fn transient(e: &zk::Error) -> bool {
    use zk::Error::*;
    connection_lost(e)
        || matches!(
            e,
            Timeout
                | NoHosts
                | SessionExpired
                | SessionMoved
                | ClientClosed
                | Throttled
                | NotReadOnly
        )
}

/// Maps `e`, raised while doing `what`: transient trouble is
/// [`LockError::Unavailable`], everything else [`LockError::Store`].
pub(crate) fn map(what: impl Into<String>, e: zk::Error) -> LockError {
    let retry = transient(&e);
    let err = ZkError {
        what: what.into(),
        source: e,
    };
    if retry {
        LockError::unavailable(BACKEND, err)
    } else {
        LockError::store(BACKEND, err)
    }
}

/// `Unavailable`: the client was closed.
pub(crate) fn closed() -> LockError {
    LockError::unavailable(BACKEND, "this ZooKeeper client was closed")
}

/// `NotHeld` for `lease`.
pub(crate) fn not_held(lease: &Lease) -> LockError {
    LockError::NotHeld {
        name: lease.name().clone(),
    }
}

/// A retryable error: our queue node went away between its create and the
/// grant (its session ended).
pub(crate) fn vanished(name: &LockName) -> LockError {
    LockError::unavailable(
        BACKEND,
        format!("our queue node for {name} went away before the grant (its session ended)"),
    )
}
