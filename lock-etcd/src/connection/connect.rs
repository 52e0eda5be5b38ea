//! Connecting: the etcd client's options (keep-alive, leader requirement,
//! credentials, TLS), the connection, what the cluster is checked for at
//! connect ([`probe`](super::probe)), and the parts of one backend instance
//! wired together.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use lockcore::LockError;

use crate::config::{EtcdConfig, TlsConfig};
use crate::connection::Conn;
use crate::connection::client::Inner;
use crate::connection::probe;
use crate::connection::session::Sessions;
use crate::error::timed;
use crate::fence::floor::Floor;
use crate::keys::Keys;
use crate::wait::hub::Hub;
use crate::wait::line::Lines;
use crate::wait::notify::Notices;

impl Inner {
    /// Connects, authenticates if a user is configured, learns the smallest
    /// lease TTL the cluster enforces and reads the fence floor (see
    /// [`probe`]).
    pub(crate) async fn connect(config: &EtcdConfig) -> Result<Inner, LockError> {
        config.validate()?;
        let endpoints = config.endpoints();
        let limit = config.connect_timeout + config.request_timeout;
        let client = timed(
            limit,
            "connect",
            Client::connect(endpoints.clone(), Some(options(config))),
        )
        .await?;
        let conn = Arc::new(Conn::new(client.clone()));
        let caps = probe::capabilities(&client, &conn, config.request_timeout).await?;
        let keys = Keys::new(&config.prefix);
        let timeout = config.request_timeout;
        let hub = Arc::new(Hub::new(conn.clone(), timeout));
        let floor = Arc::new(Floor::new(&keys));
        let notices = Notices {
            hub: hub.clone(),
            conn: conn.clone(),
            keys: keys.clone(),
            floor: floor.clone(),
            timeout,
        };
        let sessions = Arc::new_cyclic(|sessions: &std::sync::Weak<Sessions>| {
            let sessions = sessions.clone();
            Sessions::new(
                conn.clone(),
                keys.clone(),
                timeout,
                config.clock.clone(),
                floor.clone(),
                Box::new(move |session| notices.follow(sessions.clone(), session)),
            )
        });
        probe::fence_floor(&client, &config.prefix, &floor, timeout).await?;
        drop(client); // from here on, only through the conn
        Ok(Inner {
            lines: Arc::new(Lines::new(
                hub.clone(),
                conn.clone(),
                timeout,
                floor.clone(),
            )),
            floor,
            hub,
            sessions,
            clock: config.clock.clone(),
            conn,
            keys,
            caps,
            timeout,
            endpoints,
            prefix: config.prefix.clone(),
            closed: std::sync::atomic::AtomicBool::new(false),
            closing: tokio::sync::Mutex::new(false),
        })
    }
}

/// The etcd client's options for `config`.
fn options(config: &EtcdConfig) -> ConnectOptions {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        // etcd's default `--grpc-keepalive-min-time` is 5 s: ping no faster.
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
        // A member cut off from the leader fails requests instead of
        // serving stale reads or silent watches.
        .with_require_leader(true);
    if let Some((user, password)) = &config.user {
        options = options
            .with_user(user.clone(), password.clone())
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &config.tls {
        options = options.with_tls(tls_options(tls));
    }
    options
}

fn tls_options(tls: &TlsConfig) -> TlsOptions {
    let mut options = TlsOptions::new();
    options = match &tls.ca_pem {
        Some(ca) => options.ca_certificate(Certificate::from_pem(ca)),
        None => options.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.identity_pem {
        options = options.identity(Identity::from_pem(cert, key));
    }
    if let Some(domain) = &tls.domain {
        options = options.domain_name(domain.clone());
    }
    options
}
