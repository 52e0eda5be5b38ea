//! `EtcdBackend`: the `LockBackend` on etcd v3.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use lockcore::backend::wait::{WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockRequest, Polling, async_trait};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    ReleaseOutcome,
};

use crate::client::Inner;
use crate::config::EtcdConfig;
use crate::conn::Conn;
use crate::error::timed;
use crate::floor::Floor;
use crate::hub::Hub;
use crate::keys::Keys;
use crate::line::Lines;
use crate::notify::Notices;
use crate::session::Sessions;
use crate::{probe, wait};

/// Locks in etcd. See the crate docs for the design and guarantees.
///
/// Clones share one connection, one session per TTL and one watch stream;
/// call [`connect_with`](Self::connect_with) again for an independent client.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

impl EtcdBackend {
    /// Connects with an `etcd://` or `etcds://` URL (see
    /// [`EtcdConfig::from_url`]).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL; otherwise as
    /// [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(EtcdConfig::from_url(url)?).await
    }

    /// Connects, authenticates if a user is configured, and learns the
    /// smallest lease TTL the cluster enforces (by granting a 1 s lease and
    /// reading back what etcd made of it), so [`capabilities`](LockBackend::capabilities)
    /// never promises a TTL etcd would silently raise.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an invalid configuration,
    /// [`LockError::Unavailable`] when etcd cannot be reached in time,
    /// [`LockError::Store`] when it refuses (bad credentials, no permission).
    pub async fn connect_with(config: EtcdConfig) -> Result<Self, LockError> {
        config.validate()?;
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
            let mut tls_options = TlsOptions::new();
            if let Some(ca) = &tls.ca_pem {
                tls_options = tls_options.ca_certificate(Certificate::from_pem(ca));
            } else {
                tls_options = tls_options.with_native_roots();
            }
            if let Some((cert, key)) = &tls.identity_pem {
                tls_options = tls_options.identity(Identity::from_pem(cert, key));
            }
            if let Some(domain) = &tls.domain {
                tls_options = tls_options.domain_name(domain.clone());
            }
            options = options.with_tls(tls_options);
        }
        let endpoints = config.endpoints();
        let limit = config.connect_timeout + config.request_timeout;
        let client = timed(
            limit,
            "connect",
            Client::connect(endpoints.clone(), Some(options)),
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
        let inner = Inner {
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
        };
        Ok(EtcdBackend {
            inner: Arc::new(inner),
        })
    }

    /// The underlying etcd client (shares this backend's connection), for
    /// your own transactions with [`fence_compare`](Self::fence_compare).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] once the backend was closed
    /// ([`LockBackend::close`]).
    pub fn etcd_client(&self) -> Result<Client, LockError> {
        self.inner.conn.get()
    }

    /// Live sessions of this client: one lease per TTL in use, which every
    /// lock and permit of that TTL is attached to (for tests and metrics).
    pub fn sessions(&self) -> usize {
        self.inner.sessions.live()
    }

    /// Key prefixes this client watches on its one watch stream right now:
    /// queues it waits on (or used in the last few seconds), one per
    /// session for eviction notices, and the fence floor's key while it has
    /// a session (for tests and metrics).
    pub fn watched(&self) -> usize {
        self.inner.hub.watched()
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<String> = self
            .inner
            .endpoints
            .iter()
            .map(|e| lockcore::backend::redact_url(e))
            .collect();
        f.debug_struct("EtcdBackend")
            .field("endpoints", &endpoints)
            .field("prefix", &self.inner.prefix)
            .field("min_ttl", &self.inner.caps.min_ttl)
            .field("sessions", &self.inner.sessions.live())
            .field("watched", &self.inner.hub.watched())
            .finish()
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.inner.open()?;
        match (request.kind(), request.permits()) {
            (Kind::Lock, _) => self.inner.try_acquire(request).await,
            (Kind::Semaphore, Some(permits)) => {
                self.inner.try_acquire_permit(request, permits).await
            }
            (kind, _) => Err(kind.unsupported(crate::error::BACKEND)),
        }
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.inner.open().is_err() {
            return leases.iter().map(|_| Err(crate::conn::closed())).collect();
        }
        self.inner.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.open()?;
        self.inner.release(lease).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.inner.open()?;
        match kind {
            Kind::Lock => Ok(self.inner.inspect(name).await?.into_iter().collect()),
            Kind::Semaphore => self.inner.inspect_permits(name).await,
            kind => Err(kind.unsupported(crate::error::BACKEND)),
        }
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.open()?;
        self.inner.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.inner.open()?;
        match kind {
            Kind::Lock => self.inner.watch(name).await,
            Kind::Semaphore => self.inner.watch_permits(name).await,
            kind => Err(kind.unsupported(crate::error::BACKEND)),
        }
    }

    /// A lock waits in line (the crate docs); a permit in lockcore's loop,
    /// woken by `watch`.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.inner.open()?;
        match request.kind() {
            Kind::Lock => wait::acquire(&self.inner, request, wait).await,
            _ => lockcore::backend::wait::wait(wait, &mut Polling::new(self, request)).await,
        }
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.capabilities().check_fence_floor(floor)?;
        self.inner.open()?;
        self.inner.raise_fence_floor(floor).await
    }

    /// Fires the loss signal of every lease this client granted and still
    /// holds, finishes its clean-ups (the entry of a waiter that gave up,
    /// for at most the request timeout), revokes its sessions (etcd deletes
    /// every key on them at once: held locks, waiting entries, anything a
    /// lost reply left), ends its watch stream, views and keeper, and drops
    /// its connection. Clones share the client: they are all closed.
    async fn close(&self) -> Result<(), LockError> {
        self.inner.close().await
    }
}
