//! `EtcdBackend`: the `LockBackend` on etcd v3.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use lockcore::backend::{LockRequest, WaitPolicy, Wakeup, async_trait};
use lockcore::{
    Attempt, Capabilities, ExpiryClock, Fairness, FenceDurability, FencingToken, Holder, Lease,
    LockBackend, LockError, LockName, ReleaseOutcome,
};

use crate::client::Inner;
use crate::config::EtcdConfig;
use crate::error::{BACKEND, timed};
use crate::floor::Floor;
use crate::hub::Hub;
use crate::keys::Keys;
use crate::line::Lines;
use crate::notify::Notices;
use crate::session::Sessions;
use crate::wait;

/// etcd refuses lease TTLs above this (`MaxLeaseTTL`, 9e9 s).
pub const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

/// How often etcd's leader looks for expired leases (etcd 3.4's lessor
/// loop); it then revokes them through raft.
const EXPIRY_SWEEP: Duration = Duration::from_millis(500);

/// The fixed part of how long after its TTL etcd may keep a lock whose
/// holder died, on a cluster whose minimum lease TTL is `min_ttl`; the
/// capabilities add 100% of the lock's TTL
/// ([`Capabilities::slack_for`](lockcore::Capabilities::slack_for)).
///
/// Without a leader change, one expiry sweep. etcd 3.4 keeps lease
/// deadlines in the leader's memory only: a new leader (after a leader loss
/// or a restart) restarts every lease at its full TTL plus one election
/// timeout. Electing it takes up to two election timeouts (followers wait a
/// random one to two), four with a split vote. A holder that died just
/// before its lease's sweep is then revoked
///
/// ```text
/// TTL + sweep (missed) + 4 × election (new leader) + election + TTL (restarted lease) + sweep
/// ```
///
/// after its last renewal: the slack is one more TTL (the part that grows
/// with the TTL), five election timeouts and two sweeps. etcd's minimum
/// lease TTL is 1.5 election timeouts rounded up to whole seconds, so an
/// election timeout is at most two thirds of it: five of them are at most
/// 10/3 of the minimum TTL. A restart adds its downtime; every further
/// leader change adds as much again. Measured on a 3-member cluster with
/// 500 ms elections and 1 s leases, a dead holder's lock went up to 3.5 s
/// past its TTL when the leader was killed, 60 times at points across the
/// lease (`tests/failover.rs`).
fn fixed_expiry_slack(min_ttl: Duration) -> Duration {
    let five_elections = min_ttl * 10 / 3;
    five_elections + EXPIRY_SWEEP * 2
}

/// The part of the expiry slack that grows with the TTL: a leader change
/// restarts a lease at its full TTL.
const SLACK_TTL_PERCENT: u32 = 100;

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
        // Probe: etcd raises any TTL below its minimum without saying so.
        let probe = timed(
            config.request_timeout,
            "lease grant",
            client.lease_client().grant(1, None),
        )
        .await?;
        let min_secs = u64::try_from(probe.ttl()).unwrap_or(0).max(1);
        let min_ttl = Duration::from_secs(min_secs);
        let mut leases = client.lease_client();
        tokio::spawn(async move {
            let _ = leases.revoke(probe.id()).await;
        });
        let caps = Capabilities::new(BACKEND)
            .expiry_clock(ExpiryClock::StoreLeaseTimer)
            .ttl_range(min_ttl, MAX_TTL)
            .ttl_granularity(Duration::from_secs(1))
            .fairness(Fairness::Fifo)
            .fence_durability(FenceDurability::Durable)
            .notifications(true)
            .semaphores(true)
            .fence_floor(true)
            .expiry_slack(fixed_expiry_slack(min_ttl))
            .expiry_slack_ttl_percent(SLACK_TTL_PERCENT)
            // Evictions leave a notice the holder follows (see `notify`).
            .eviction_notice(Some(crate::notify::NOTICE));
        let keys = Keys::new(&config.prefix);
        let timeout = config.request_timeout;
        let hub = Arc::new(Hub::new(client.clone(), timeout));
        let notices = Notices {
            hub: hub.clone(),
            client: client.clone(),
            keys: keys.clone(),
            timeout,
        };
        let sessions = Arc::new_cyclic(|sessions: &std::sync::Weak<Sessions>| {
            let sessions = sessions.clone();
            Sessions::new(
                client.clone(),
                keys.clone(),
                timeout,
                Box::new(move |session| notices.follow(sessions.clone(), session)),
            )
        });
        let floor = Arc::new(Floor::new(&keys));
        // The first read under the prefix: a user without permission on it
        // is told so now, not at its first lock.
        let known = timed(
            timeout,
            "fence floor",
            client.kv_client().get(keys.fence_floor(), None),
        )
        .await
        .map_err(|e| match e {
            LockError::Store { .. } => LockError::store(
                BACKEND,
                format!(
                    "cannot read under the key prefix {:?} ({e}): the etcd user needs read-write on it \
                     (etcdctl role grant-permission --prefix <role> readwrite {:?})",
                    config.prefix, config.prefix
                ),
            ),
            other => other,
        })?;
        floor.learn(known.kvs())?;
        let inner = Inner {
            lines: Arc::new(Lines::new(
                hub.clone(),
                client.clone(),
                timeout,
                floor.clone(),
            )),
            floor,
            hub,
            sessions,
            client,
            keys,
            caps,
            timeout,
            endpoints,
            prefix: config.prefix.clone(),
        };
        Ok(EtcdBackend {
            inner: Arc::new(inner),
        })
    }

    /// The underlying etcd client (shares this backend's connection), for
    /// your own transactions with [`fence_compare`](Self::fence_compare).
    pub fn etcd_client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Live sessions of this client: one lease per TTL in use, which every
    /// lock and permit of that TTL is attached to (for tests and metrics).
    pub fn sessions(&self) -> usize {
        self.inner.sessions.live()
    }

    /// Key prefixes this client watches on its one watch stream right now:
    /// queues it waits on (or used in the last few seconds), and one per
    /// session for eviction notices (for tests and metrics).
    pub fn watched(&self) -> usize {
        self.inner.hub.watched()
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
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
        self.inner.try_acquire(request).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let mut outcome = self.inner.renew_many(std::slice::from_ref(lease)).await;
        outcome.pop().unwrap_or_else(|| {
            Err(LockError::NotHeld {
                name: lease.name().clone(),
            })
        })
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.inner.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        self.inner.inspect(name).await
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch(name).await
    }

    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        wait::acquire(&self.inner, request, wait).await
    }

    async fn try_acquire_permit(
        &self,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        self.inner.try_acquire_permit(request, permits).await
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        self.inner.inspect_permits(name).await
    }

    async fn watch_permits(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch_permits(name).await
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.inner.raise_fence_floor(floor).await
    }
}
