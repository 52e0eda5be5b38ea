//! Connecting: the command connection (checked with a `PING`), the checks
//! at connect (`probe.rs`: persistence, eviction policy; the replication id,
//! `fence/failover.rs`), the instance's
//! `Client` and its subscription; then the rules every request follows
//! (`commands.rs`), the command connection to one server or a Redis
//! Cluster (`con.rs`), what a Cluster adds (`cluster.rs`), the scripts
//! (`script.rs`), TLS (`tls.rs`), background clean-ups (`background.rs`)
//! and closing (`closing.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{CancellationToken, Cleanups, timed};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, ConnectionAddr};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::RedisConfig;
use crate::error::{self, BACKEND, TcpProbe};
use crate::fence::failover::Failover;
use crate::keys;
use crate::wait::notify::Notifier;

pub(crate) mod background;
pub(crate) mod client;
mod closing;
pub(crate) mod cluster;
pub(crate) mod commands;
pub(crate) mod con;
pub(crate) mod probe;
pub(crate) mod script;
pub(crate) mod target;
#[cfg(feature = "tls")]
pub(crate) mod tls;

use client::Client;
use commands::Commands;
use con::{Con, Opener};
use probe::{Eviction, Persistence};
use target::Target;

/// A connected backend instance: its client, and what the checks at
/// connect found.
pub(crate) struct Connected {
    pub(crate) client: Arc<Client>,
    pub(crate) persistence: Persistence,
    pub(crate) eviction: Eviction,
}

/// Connects as `config` says: opens (or takes) the command connection,
/// proves it with a `PING`, checks the server's settings (see
/// [`probe::check`]), and sets up the instance's client, whose
/// subscription connects on first use.
///
/// # Errors
/// [`LockError::InvalidConfig`] for an invalid prefix or timeout, or a
/// server whose settings the config does not accept; [`LockError::Unavailable`]
/// when the server cannot be reached in time; [`LockError::Store`] when it
/// refuses the credentials.
pub(crate) async fn connect(mut config: RedisConfig) -> Result<Connected, LockError> {
    config.validate()?;
    if config.uses_tls() {
        #[cfg(feature = "tls")]
        tls::install_provider();
    }
    let op_timeout = config.connect_timeout + config.response_timeout;
    let target = match (&config.sentinel, &config.cluster) {
        (None, Some(nodes)) => Target::nodes(&config, nodes),
        (None, None) => Target::fixed(config.client.clone()),
        (Some(sentinels), _) => {
            let asking = Target::sentinel(sentinels, &config.client);
            let target = timed(BACKEND, "asking the sentinels", op_timeout, asking).await?;
            config.client = target.client();
            target
        }
    };
    let target = Arc::new(target);
    let endpoint = config.endpoint();
    let manager = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1));
    let (closing, tasks) = (CancellationToken::new(), TaskTracker::new());
    let (commands, persistence, eviction, failover) = match config.cluster.clone() {
        None => {
            let ours = config.connection.is_none();
            let con = match config.connection.clone() {
                Some(con) => con,
                None => open(&config, &endpoint, manager.clone()).await?,
            };
            let mut con = Con::Single(con);
            // A first command proves the credentials and the link.
            let ping = async {
                let ping = redis::cmd("PING");
                ping.query_async::<String>(&mut con)
                    .await
                    .map_err(|e| error::at_connect(&endpoint, e))
            };
            timed(BACKEND, &format!("PING {endpoint}"), op_timeout, ping).await?;
            let refusing = cluster::refuse_cluster_node(&mut con, &endpoint);
            timed(BACKEND, "INFO cluster", op_timeout, refusing).await?;
            let (persistence, eviction) =
                probe::check(&config, &endpoint, &mut con, op_timeout).await?;
            let failover = Failover::probe(&mut con, &endpoint, &config, closing.clone(), false);
            let failover = timed(BACKEND, "INFO replication", op_timeout, failover).await?;
            let opener = Opener::Single(manager);
            let commands = Commands::new(target.clone(), opener, op_timeout, (con, ours), None);
            (commands, persistence, eviction, failover)
        }
        #[cfg(feature = "cluster")]
        Some(nodes) => {
            if config.connection.is_some() {
                return Err(LockError::config(
                    "a Redis Cluster client opens its own connections: RedisConfig::connection \
                     takes one server's",
                ));
            }
            let opened = cluster::open_cluster(&config, &nodes, manager, op_timeout).await?;
            let mut seed = Con::Single(opened.caller.clone());
            let failover = Failover::probe(&mut seed, &endpoint, &config, closing.clone(), true);
            let failover = timed(BACKEND, "INFO replication", op_timeout, failover).await?;
            let con = (opened.con, true);
            let commands = Commands::new(
                target.clone(),
                opened.opener,
                op_timeout,
                con,
                Some(opened.caller),
            );
            (commands, opened.persistence, opened.eviction, failover)
        }
        #[cfg(not(feature = "cluster"))]
        Some(_) => {
            return Err(LockError::config(
                "a Redis Cluster URL needs lock-redis's `cluster` feature",
            ));
        }
    };
    let (notifier, events) = Notifier::new(
        target.clone(),
        (op_timeout, config.response_timeout),
        keys::wake_channel(&config.key_prefix),
        keys::evict_channel(&config.key_prefix),
        closing.clone(),
        tasks.clone(),
    );
    let client = Arc::new(Client {
        cleanups: Cleanups::new(),
        commands,
        slot_owners: Default::default(),
        prefix: config.key_prefix,
        endpoint,
        op_timeout,
        claim_window: config.response_timeout,
        notifier,
        failover,
        closing: closing.clone(),
        tasks: tasks.clone(),
        acquires: TaskTracker::new(),
    });
    tasks.spawn(background::handle_events(
        events,
        Arc::downgrade(&client),
        closing,
        tasks.clone(),
    ));
    Ok(Connected {
        client,
        persistence,
        eviction,
    })
}

/// Opens the command connection. One plain attempt comes first, within
/// the connect timeout: a failure retrying cannot fix (credentials,
/// certificates) is reported at once, naming the server and the cause,
/// instead of being retried into a timeout; then the connection manager
/// (which retries transient failures) connects, within the connect
/// timeout too.
async fn open(
    config: &RedisConfig,
    endpoint: &str,
    manager: ConnectionManagerConfig,
) -> Result<ConnectionManager, LockError> {
    // No timeout of the client's own: ours, below, explains itself.
    let once = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(Some(config.response_timeout));
    let checked = config
        .client
        .get_multiplexed_async_connection_with_config(&once);
    drop(within_connect_timeout(config, endpoint, checked).await?);
    let connecting = config.client.get_connection_manager_with_config(manager);
    within_connect_timeout(config, endpoint, connecting).await
}

/// Runs `connecting` within the connect timeout. If it is not done halfway
/// through, a plain TCP connect goes beside it, so that running out of
/// time can say why: nothing listens, nothing answers at all, or the port
/// accepts but does not speak (plain text on a `rediss://` URL, a stalled
/// server).
async fn within_connect_timeout<T>(
    config: &RedisConfig,
    endpoint: &str,
    connecting: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, LockError> {
    let deadline = Instant::now() + config.connect_timeout;
    tokio::pin!(connecting);
    let halfway = Instant::now() + config.connect_timeout / 2;
    if let Ok(outcome) = tokio::time::timeout_at(halfway, &mut connecting).await {
        return outcome.map_err(|e| error::at_connect(endpoint, e));
    }
    let probe = tokio::spawn(probe_tcp(
        config.client.get_connection_info().addr().clone(),
        deadline,
    ));
    match tokio::time::timeout_at(deadline, connecting).await {
        Ok(outcome) => {
            probe.abort();
            outcome.map_err(|e| error::at_connect(endpoint, e))
        }
        Err(_) => {
            let found = probe.await.unwrap_or(TcpProbe::Unknown);
            Err(error::connect_timed_out(
                endpoint,
                config.connect_timeout,
                config.uses_tls(),
                found,
            ))
        }
    }
}

/// What a bare TCP connect to `addr` finds by `deadline`.
async fn probe_tcp(addr: ConnectionAddr, deadline: Instant) -> TcpProbe {
    let (host, port) = match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => (host, port),
        _ => return TcpProbe::Unknown,
    };
    match tokio::time::timeout_at(
        deadline,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(_)) => TcpProbe::Accepted,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => TcpProbe::Refused,
        Ok(Err(e)) => TcpProbe::Failed(e),
        Err(_) => TcpProbe::Silent,
    }
}
