//! etcd client errors mapped to `LockError`: retryable (transport, leader
//! changes, timeouts) or permanent (auth, permission, bad request).

use std::future::Future;
use std::time::Duration;

use lockcore::LockError;

pub(crate) const BACKEND: &str = "etcd";

// gRPC status codes (stable numbers of the gRPC spec).
type Code = i32;
const CANCELLED: Code = 1;
const UNKNOWN: Code = 2;
const DEADLINE_EXCEEDED: Code = 4;
const NOT_FOUND: Code = 5;
const RESOURCE_EXHAUSTED: Code = 8;
const ABORTED: Code = 10;
const INTERNAL: Code = 13;
const UNAVAILABLE: Code = 14;

/// Whether the server said the lease does not exist (expired or revoked).
pub(crate) fn lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() as i32 == NOT_FOUND && status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(msg) => msg.contains("lease not found"),
        _ => false,
    }
}

/// Maps a client error: transport trouble and transient server states are
/// retryable, everything else is permanent.
pub(crate) fn map(e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    if let Some(verdict) = tls_verdict(&e) {
        return LockError::store(BACKEND, format!("TLS handshake failed: {verdict}"));
    }
    let retryable = match &e {
        E::GRpcStatus(status) => {
            let code = status.code() as Code;
            matches!(
                code,
                CANCELLED
                    | UNKNOWN
                    | DEADLINE_EXCEEDED
                    | RESOURCE_EXHAUSTED
                    | ABORTED
                    | UNAVAILABLE
            ) || (code == INTERNAL && local_transport_fault(status.message()))
        }
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) | E::EndpointError(_) => {
            return LockError::config_caused_by("the etcd client rejected its configuration", e);
        }
        _ => false,
    };
    if retryable {
        LockError::unavailable(BACKEND, e)
    } else {
        LockError::store(BACKEND, e)
    }
}

/// An `INTERNAL` status made up by the client's own HTTP/2 layer (a broken
/// or garbled connection: tonic's "h2 protocol error: ..."), not sent by
/// etcd, whose own messages start with "etcdserver:". The next request goes
/// out on a new connection, so it is retryable.
fn local_transport_fault(message: &str) -> bool {
    message.contains("transport") || message.starts_with("h2 protocol error")
}

/// The TLS layer's verdict on a certificate, somewhere in the error chain:
/// ours rejecting the server's (untrusted CA, wrong name) or the server
/// rejecting ours (none, or not signed by its CA). Retrying cannot change
/// it, so it is permanent. (Under TLS 1.3 the server's rejection mostly
/// surfaces as a dropped connection instead, which stays retryable.)
fn tls_verdict(e: &etcd_client::Error) -> Option<String> {
    const VERDICTS: [&str; 2] = ["invalid peer certificate", "received fatal alert: "];
    const CERTIFICATE_ALERTS: [&str; 8] = [
        "BadCertificate",
        "UnsupportedCertificate",
        "CertificateRevoked",
        "CertificateExpired",
        "CertificateUnknown",
        "UnknownCA",
        "CertificateRequired",
        "AccessDenied",
    ];
    let mut link: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = link {
        let text = error.to_string();
        if let Some(at) = VERDICTS.iter().find_map(|v| text.find(v)) {
            let verdict = &text[at..];
            if !verdict.starts_with("received fatal alert")
                || CERTIFICATE_ALERTS.iter().any(|a| verdict.contains(a))
            {
                return Some(verdict.to_owned());
            }
        }
        link = error.source();
    }
    None
}

/// Runs one etcd request for at most `limit` ([`lockcore::backend::timed`]),
/// its error mapped: running out is retryable.
pub(crate) async fn timed<T>(
    limit: Duration,
    what: &'static str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LockError> {
    lockcore::backend::timed(BACKEND, what, limit, async { request.await.map_err(map) }).await
}

/// A reply that does not have the shape etcd promises.
pub(crate) fn protocol(what: impl Into<String>) -> LockError {
    LockError::store(
        BACKEND,
        format!("unexpected reply from etcd: {}", what.into()),
    )
}
