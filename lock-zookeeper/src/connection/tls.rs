//! Why a server gave no session over TLS. `zookeeper-client` drops the
//! handshake's error and only reports that no server gave it a session, so
//! when connecting fails this adapter shakes hands itself, with the same CA
//! and client certificate, and says what went wrong: a certificate not
//! trusted or not issued for the host named, or a server refusing ours.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What a handshake with one server showed.
pub(crate) enum Verdict {
    /// The handshake completed: TLS is not what kept the session away.
    Accepted,
    /// The configuration can never work with this server (a certificate
    /// refused either way): retrying cannot help.
    Refused(String),
    /// The handshake broke off (a plaintext port, a server going away).
    Failed(String),
}

/// Shakes hands with the server `host` (as the connect string names it,
/// `name:port`) over `stream`, until `deadline`.
pub(crate) async fn handshake(
    stream: TcpStream,
    host: &str,
    trust: Arc<rustls::ClientConfig>,
    deadline: Instant,
) -> Verdict {
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let Ok(name) = ServerName::try_from(name.to_owned()) else {
        return Verdict::Refused(format!(
            "{name:?} is no host name or address a certificate can be issued for"
        ));
    };
    let shaking = tokio::task::spawn_blocking(move || -> io::Result<()> {
        let mut socket = stream.into_std()?;
        socket.set_nonblocking(false)?;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        socket.set_read_timeout(Some(left))?;
        socket.set_write_timeout(Some(left))?;
        let mut tls = rustls::ClientConnection::new(trust, name).map_err(io::Error::other)?;
        while tls.is_handshaking() {
            tls.complete_io(&mut socket)?;
        }
        // Under TLS 1.3 a server refuses a client certificate after the
        // client finished: its alert, if any, follows at once.
        socket.set_read_timeout(Some(left.min(Duration::from_millis(250))))?;
        match tls.complete_io(&mut socket) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    });
    match shaking.await {
        Ok(Ok(())) => Verdict::Accepted,
        Ok(Err(e)) => verdict(&e),
        Err(e) => Verdict::Failed(format!("the TLS handshake was not tried ({e})")),
    }
}

/// A failed handshake's verdict: rustls's own error says who refused what.
fn verdict(e: &io::Error) -> Verdict {
    match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(tls @ rustls::Error::InvalidCertificate(_)) => Verdict::Refused(format!(
            "its TLS certificate is refused ({tls}): tls_ca must name the CA that issued it, \
             and it must be issued for the host the URL names"
        )),
        Some(tls @ rustls::Error::AlertReceived(_)) => Verdict::Refused(format!(
            "it refused the TLS handshake ({tls}): does it require a client certificate \
             from a CA it trusts (tls_cert, tls_key)?"
        )),
        Some(tls) => Verdict::Failed(format!("the TLS handshake failed ({tls})")),
        None => Verdict::Failed(format!(
            "the TLS handshake broke off ({e}): does this port serve TLS?"
        )),
    }
}
