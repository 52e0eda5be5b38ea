//! Opening a session (and saying why it could not be opened), and closing
//! a session that this client already gave up.

use std::time::Duration;

use lockcore::LockError;
use tokio::net::TcpStream;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::{Scheme, ZooKeeperConfig};
use crate::error::{BACKEND, map};

/// A connector with `config`'s timeouts and credentials.
fn connector(config: &ZooKeeperConfig) -> zk::Connector {
    let mut connector = zk::Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_fail_eagerly();
    if let Some(timeout) = config.connection_timeout {
        connector = connector.with_connection_timeout(timeout);
    }
    if let Some(c) = &config.credentials {
        connector = match c.scheme {
            Scheme::Digest => connector.with_auth("digest", &c.auth()),
            #[cfg(feature = "sasl")]
            Scheme::Sasl => connector.with_sasl(zk::SaslOptions::digest_md5(
                c.user.clone(),
                c.password.clone(),
            )),
        };
    }
    connector
}

/// Connects `connector` to `config`'s servers, over TLS for `zks://`.
async fn connect(
    connector: zk::Connector,
    config: &ZooKeeperConfig,
) -> Result<zk::Client, zk::Error> {
    #[cfg(feature = "tls")]
    if let Some(tls) = &config.tls {
        crate::config::install_provider();
        return (connector.with_tls(tls.options.clone()))
            .secure_connect(&config.connect)
            .await;
    }
    connector.connect(&config.connect).await
}

/// What a look at the servers checks beyond a TCP connect: the TLS
/// handshake, with the configured CA and client certificate.
#[cfg(feature = "tls")]
type Trust = Option<std::sync::Arc<rustls::ClientConfig>>;
/// Without TLS there is no handshake to look at.
#[cfg(not(feature = "tls"))]
type Trust = Option<std::sync::Arc<std::convert::Infallible>>;

fn trust(config: &ZooKeeperConfig) -> Trust {
    #[cfg(feature = "tls")]
    return config.tls.as_ref().map(|tls| tls.diagnosis.clone());
    #[cfg(not(feature = "tls"))]
    {
        let _ = config;
        None
    }
}

/// Opens a session within the connect timeout. When that fails, the error
/// says why, server by server: the client itself only reports that no
/// server gave it a session.
pub(crate) async fn open(config: &ZooKeeperConfig) -> Result<zk::Client, LockError> {
    let started = Instant::now();
    let deadline = started + config.connect_timeout;
    let connecting = connect(connector(config), config);
    tokio::pin!(connecting);
    // The servers are looked at only when connecting is slow, or failed.
    let mut looking = None;
    let outcome = loop {
        tokio::select! {
            outcome = &mut connecting => break Some(outcome),
            _ = tokio::time::sleep_until(started + config.connect_timeout / 2), if looking.is_none() => {
                looking = Some(tokio::spawn(look_at_servers(config.connect.clone(), trust(config), deadline)));
            }
            _ = tokio::time::sleep_until(deadline) => break None,
        }
    };
    let failed = match outcome {
        Some(Ok(client)) => {
            if let Some(looking) = looking {
                looking.abort();
            }
            return Ok(client);
        }
        Some(Err(e @ zk::Error::BadArguments(_))) => {
            return Err(LockError::config_caused_by(
                format!("ZooKeeper connect string {:?} is not valid", config.connect),
                e,
            ));
        }
        Some(Err(e)) if !unreachable(&e) => {
            return Err(map(
                format!("connecting to ZooKeeper at {}", config.connect),
                e,
            ));
        }
        Some(Err(e)) => format!("failed after {:?} ({e})", started.elapsed()),
        None => format!("no session within {:?}", config.connect_timeout),
    };
    let (servers, refused) = match looking {
        Some(looking) => looking.await.unwrap_or_default(),
        None => look_at_servers(config.connect.clone(), trust(config), deadline).await,
    };
    let message = format!(
        "connecting to ZooKeeper at {}: {failed}: {servers}",
        config.connect
    );
    Err(match refused {
        // A certificate refused: no retry fixes the configuration.
        true => LockError::store(BACKEND, message),
        false => LockError::unavailable(BACKEND, message),
    })
}

/// Whether `e` only says that no server could be reached.
fn unreachable(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::NoHosts | zk::Error::Timeout | zk::Error::ConnectionLoss | zk::Error::Custom(_)
    )
}

/// What each server of `connect` (`host:port[,...][/chroot]`) does when
/// asked for a TCP connection (and a TLS handshake, with `trust`), until
/// `deadline`; and whether one refused a certificate.
async fn look_at_servers(connect: String, trust: Trust, deadline: Instant) -> (String, bool) {
    let hosts = connect.split('/').next().unwrap_or_default();
    let looks: Vec<_> = hosts
        .split(',')
        .map(|host| {
            let host = (host.strip_prefix("tcp://"))
                .or_else(|| host.strip_prefix("tcp+tls://"))
                .unwrap_or(host)
                .to_owned();
            let trust = trust.clone();
            tokio::spawn(async move {
                let (seen, refused) = look_at(&host, trust, deadline).await;
                (format!("{host}: {seen}"), refused)
            })
        })
        .collect();
    let mut seen = Vec::with_capacity(looks.len());
    let mut refused = false;
    for look in looks {
        let (text, final_) = look
            .await
            .unwrap_or_else(|e| (format!("not looked at ({e})"), false));
        seen.push(text);
        refused |= final_;
    }
    (seen.join("; "), refused)
}

/// What the server `host` does; `true` if it refused a certificate.
async fn look_at(host: &str, trust: Trust, deadline: Instant) -> (String, bool) {
    let looked = tokio::time::timeout_at(deadline, async {
        let addrs = match tokio::net::lookup_host(host).await {
            Ok(addrs) => addrs.collect::<Vec<_>>(),
            Err(e) => return (format!("cannot resolve the name ({e})"), false),
        };
        let _ = &trust;
        let mut last = String::from("resolves to no address");
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    #[cfg(feature = "tls")]
                    if let Some(trust) = trust.clone() {
                        use super::tls::{Verdict, handshake};
                        return match handshake(stream, host, trust, deadline).await {
                            Verdict::Accepted => (NO_SESSION.to_owned(), false),
                            Verdict::Refused(why) => (why, true),
                            Verdict::Failed(why) => (why, false),
                        };
                    }
                    drop(stream);
                    return (NO_SESSION.to_owned(), false);
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    last = "connection refused (nothing listens there)".to_owned();
                }
                Err(e) => last = format!("cannot connect ({e})"),
            }
        }
        (last, false)
    })
    .await;
    looked.unwrap_or_else(|_| {
        let silent = "no answer to a TCP connect (down, or packets dropped)";
        (silent.to_owned(), false)
    })
}

const NO_SESSION: &str = "accepts connections but gave no ZooKeeper session \
                          (not a ZooKeeper server, not serving, or its replies are lost)";

/// Reconnects to the session `info` (an id and password) and closes it,
/// which deletes its ephemeral nodes at once. `Ok` once the servers closed
/// it or said it had already expired.
pub(crate) async fn close(
    config: &ZooKeeperConfig,
    info: zk::SessionInfo,
    within: Duration,
) -> Result<(), zk::Error> {
    let reconnecting = connect(connector(config).with_session(info), config);
    let client = match tokio::time::timeout(within, reconnecting).await {
        Err(_) => return Err(zk::Error::Timeout),
        Ok(Err(zk::Error::SessionExpired)) => return Ok(()),
        Ok(outcome) => outcome?,
    };
    let mut states = client.state_watcher();
    // The last handle: dropping it sends `closeSession`.
    drop(client);
    let closed = async {
        let mut state = states.state();
        while !state.is_terminated() {
            state = states.changed().await;
        }
        state
    };
    match tokio::time::timeout(within, closed).await {
        Ok(zk::SessionState::Closed | zk::SessionState::Expired) => Ok(()),
        Ok(_) => Err(zk::Error::ConnectionLoss),
        Err(_) => Err(zk::Error::Timeout),
    }
}
