//! One ZooKeeper session: the client, the negotiated timeout (every lease's
//! TTL) and a signal that fires when the session ends for good.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{CancellationToken, LockError};
use zookeeper_client as zk;

use crate::config::ZooKeeperConfig;
use crate::error::{BACKEND, map};
use crate::held::Keeper;
use crate::quiet::QuietQueues;

/// A live (or ended) session. Every lock node this client creates is an
/// ephemeral of one session, and lives no longer than it.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    /// The timeout the server granted, after clamping the one asked for.
    pub(crate) timeout: Duration,
    /// Cancelled once the session is expired, closed or refused: every
    /// ephemeral node it owned is gone (or going) on the server.
    pub(crate) ended: CancellationToken,
    /// Starts watching the grants that are held for a while.
    pub(crate) keeper: Arc<Keeper>,
    /// The queues this session may take without listing them.
    pub(crate) quiet: QuietQueues,
}

impl Session {
    /// Opens a session and starts watching its state.
    pub(crate) async fn open(config: &ZooKeeperConfig) -> Result<Arc<Session>, LockError> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(config.session_timeout)
            .with_fail_eagerly();
        if let Some(timeout) = config.connection_timeout {
            connector = connector.with_connection_timeout(timeout);
        }
        if let Some(digest) = &config.digest {
            connector = connector.with_auth("digest", &digest.auth());
        }
        let client =
            tokio::time::timeout(config.connect_timeout, connector.connect(&config.connect))
                .await
                .map_err(|_| {
                    LockError::unavailable(
                        BACKEND,
                        format!(
                            "no session with ZooKeeper at {} within {:?}",
                            config.connect, config.connect_timeout
                        ),
                    )
                })?
                .map_err(|e| match e {
                    zk::Error::BadArguments(_) => LockError::config_caused_by(
                        format!("ZooKeeper connect string {:?} is not valid", config.connect),
                        e,
                    ),
                    e => map(format!("connecting to ZooKeeper at {}", config.connect), e),
                })?;
        let ended = CancellationToken::new();
        let mut states = client.state_watcher();
        let signal = ended.clone();
        tokio::spawn(async move {
            let mut state = states.state();
            while !state.is_terminated() {
                state = states.changed().await;
            }
            tracing::debug!(%state, "zookeeper session ended");
            signal.cancel();
        });
        tracing::debug!(
            session = %client.session_id(),
            timeout = ?client.session_timeout(),
            asked = ?config.session_timeout,
            "zookeeper session established"
        );
        let timeout = client.session_timeout();
        Ok(Arc::new(Session {
            keeper: Keeper::start(timeout, ended.clone()),
            quiet: QuietQueues::new(&client, timeout),
            timeout,
            client,
            ended,
        }))
    }

    /// The session id, what `Stat::ephemeral_owner` holds for its nodes.
    pub(crate) fn id(&self) -> i64 {
        self.client.session_id().0
    }

    /// Whether the session ended (its ephemerals are gone or going).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled() || self.client.state().is_terminated()
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.client.session_id())
            .field("timeout", &self.timeout)
            .field("state", &self.client.state())
            .finish()
    }
}
