//! The store client every clone of a backend shares: one ZooKeeper session
//! at a time (a new one once it ends, opened in the background), what the
//! backend declares (`capabilities`), and the bound on each operation. The
//! operations themselves live in their roles (`locks`, `permits`, `fence`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::backend::{CancellationToken, Cleanups};
use lockcore::{
    Backoff, Capabilities, ExpiryClock, Fairness, FenceDurability, LeaseKind, LockError, LockName,
};
use tokio_util::task::TaskTracker;
use zookeeper_client as zk;

use super::requests::retry;
use super::session::{Session, Timing};
use crate::config::ZooKeeperConfig;
use crate::error::{BACKEND, closed, map};
use crate::keys::acls::Acls;
use crate::locks::eviction_notice::Keeper;

/// A session and the keeper that watches its longer-held grants.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) session: Arc<Session>,
    pub(crate) keeper: Arc<Keeper>,
}

impl Live {
    fn new(session: Arc<Session>) -> Arc<Live> {
        Arc::new(Live {
            keeper: Keeper::start(session.timeout, session.losing.clone(), &session.tasks),
            session,
        })
    }
}

/// What every clone of a backend shares.
#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) config: ZooKeeperConfig,
    pub(crate) acls: Arc<Acls>,
    live: Mutex<Arc<Live>>,
    reconnecting: tokio::sync::Mutex<()>,
    /// The latest negotiated session timeout, for `capabilities()`.
    timeout_ms: AtomicU64,
    /// Whether the servers keep TTL nodes (probed at connect; cleared if
    /// they refuse one later): what `set_remaining` needs.
    ttl_nodes: AtomicBool,
    /// The background clean-ups this client owes the store: removing the
    /// queue nodes of cancelled waiters, closing sessions it gave up or
    /// retired. [`close`](Self::close) finishes them.
    pub(crate) cleanups: Cleanups,
    /// Cancelled once the client is closed (or dropped).
    pub(crate) closed: CancellationToken,
    /// The client's own task (keeping a session).
    pub(crate) tasks: TaskTracker,
}

impl Client {
    /// Opens a session, creates the lock root if missing and checks that
    /// this client may queue under it.
    pub(crate) async fn open(config: ZooKeeperConfig) -> Result<Arc<Client>, LockError> {
        config.validate()?;
        let acls = Arc::new(Acls::new(config.credentials.is_some()));
        let session = Session::open(&config).await?;
        let root = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acls.dirs));
        let creating = |e| map(format!("creating the lock root {}", config.root), e);
        let handle = session.client().map_err(creating)?;
        retry(|| handle.mkdir(&config.root, &root))
            .await
            .map_err(creating)?;
        let sasl = config.auth_scheme() == Some("sasl");
        crate::connection::probe::may_queue_under(&handle, &config.root, sasl).await?;
        let ttl_nodes = crate::connection::probe::keeps_ttl_nodes(&handle, &config.root).await?;
        drop(handle);
        let client = Arc::new(Client {
            timeout_ms: AtomicU64::new(millis(session.timeout)),
            ttl_nodes: AtomicBool::new(ttl_nodes),
            live: Mutex::new(Live::new(session)),
            reconnecting: tokio::sync::Mutex::new(()),
            acls,
            config,
            cleanups: Cleanups::new(),
            closed: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        (client.tasks).spawn(keep_a_session(Arc::downgrade(&client)));
        Ok(client)
    }

    /// Whether the client was closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// `Unavailable` once the client is closed.
    pub(crate) fn refuse_closed(&self) -> Result<(), LockError> {
        if self.is_closed() {
            return Err(closed());
        }
        Ok(())
    }

    /// The current session, live or ended.
    pub(crate) fn current(&self) -> Arc<Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The live session, or a new one if it ended (expired: every lock it
    /// held is already gone on the server; retired: the client closes it).
    /// A session whose fence floor was raised is retired here, at its next
    /// use (see [`crate::fence::floor`]).
    pub(crate) async fn live(&self) -> Result<Arc<Live>, LockError> {
        self.refuse_closed()?;
        let current = self.current();
        if !current.session.is_ended() && current.session.floor_holds().await? {
            return Ok(current);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        self.refuse_closed()?;
        let current = self.current();
        if !current.session.is_ended() {
            return Ok(current);
        }
        let old = &current.session;
        if old.state() == zk::SessionState::AuthFailed {
            return Err(LockError::store(
                BACKEND,
                "ZooKeeper refused the session's credentials (AuthFailed)",
            ));
        }
        tracing::info!(timeout = ?old.timeout, "zookeeper session ended; opening a new one");
        let fresh = Session::open(&self.config).await?;
        self.timeout_ms
            .store(millis(fresh.timeout), Ordering::Relaxed);
        let live = Live::new(fresh.clone());
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = live.clone();
        // Expired here may mean given up here while the servers still keep
        // it (and its nodes): close it there. A retired session is still
        // open: close it.
        let config = self.config.clone();
        match old.state() {
            zk::SessionState::Expired => {
                (self.cleanups).spawn(crate::connection::session::reap(config, old.clone(), fresh));
            }
            state if !state.is_terminated() => {
                let (old, limit) = (old.clone(), self.close_limit());
                self.cleanups.spawn(async move {
                    if let Err(e) = old.shut(limit).await {
                        tracing::debug!(error = %e, "could not close a retired session");
                    }
                });
            }
            _ => {}
        }
        Ok(live)
    }

    /// The session timeout the server granted: the TTL of every lease.
    pub(crate) fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Whether the servers keep TTL nodes, as far as this client knows.
    pub(crate) fn keeps_ttl_nodes(&self) -> bool {
        self.ttl_nodes.load(Ordering::Relaxed)
    }

    /// The servers refused a TTL node after all (set up differently from
    /// the one probed at connect): `set_remaining` is unsupported from now on.
    pub(crate) fn refuses_ttl_nodes(&self) {
        self.ttl_nodes.store(false, Ordering::Relaxed);
    }

    /// The ZooKeeper path of `name`'s queue: one child of the root.
    pub(crate) fn lock_path(&self, name: &LockName) -> String {
        crate::keys::paths::lock(&self.config.root, name)
    }

    pub(crate) fn capabilities(&self) -> Capabilities {
        let timeout = self.session_timeout();
        let timing = Timing::new(timeout, &self.config);
        let kept = self.keeps_ttl_nodes();
        // A kept lease is a TTL node, deleted at the leader's first sweep
        // after it ran out: up to one interval late, and a tick more for
        // that delete to be committed.
        let slack = match kept {
            true => (timing.slack).max(self.config.container_check_interval + timing.tick),
            false => timing.slack,
        };
        // Any TTL from 1 ms to a year is accepted and means the session
        // timeout, which `LeaseKind::Session` declares and every lease reports.
        Capabilities::new(BACKEND)
            // A quorum decides every write: a new leader has every grant.
            .failover(lockcore::Failover::Consensus)
            .expiry_clock(ExpiryClock::Session)
            .lease_kind(LeaseKind::Session { timeout })
            .fairness(Fairness::Fifo)
            .fence_durability(FenceDurability::Durable)
            .notifications(true)
            // A forced release deletes the holder's node, which its session
            // watches from a sixteenth of the timeout after the grant on.
            .eviction_notice(Some(Keeper::watched_within(timeout)))
            // 7/5 of the timeout + 1.5 ticks (see `Timing::new`), or the
            // TTL nodes' sweep if that is longer.
            .expiry_slack(slack)
            .fence_floor(true)
            // A fence is a `czxid` (at most `i64::MAX`) plus the floor's
            // offset, summed in 64 unsigned bits. Declaring the signed range
            // keeps `2^63` of room above any accepted floor for `czxid`s to
            // grow (a leader election alone moves them by `2^32`), so no floor
            // accepted here makes later grants overflow.
            .max_fence(i64::MAX as u64)
            .semaphores(true)
            .rw_locks(true)
            // One `multi` per attempt (`crate::locks::queue::multi`).
            .atomic_multi(true)
            .sets_remaining(kept)
    }

    /// Bounds one operation by the session timeout. A request the server
    /// never answers while the connection stays up (its bytes lost on the
    /// way) would otherwise wait forever; past the session timeout, any
    /// lease it was for has run out on the client's clock anyway. Dropping
    /// the operation cleans up as a cancelled one does (a queue node is
    /// removed in the background).
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        name: &LockName,
        op: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        self.bounded_as(&format!("{what} {name}"), op).await
    }

    /// [`bounded`](Self::bounded), for an operation of no one name.
    pub(crate) async fn bounded_as<T>(
        &self,
        what: &str,
        op: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        lockcore::backend::timed(BACKEND, what, self.session_timeout(), op).await
    }
}

/// Opens a new session as soon as the current one ends, not only at the
/// next call, so that a session this client gave up (or retired) is closed
/// on the servers promptly (see [`crate::connection::session::reap`]). After each
/// reconnection, looks at once whether the fence floor was raised meanwhile
/// (a restore), so that a session resumed from before the floor is retired
/// and closed with the nodes it had then (see [`crate::fence::floor`]). Stops with
/// the backend, or when it is closed.
async fn keep_a_session(client: Weak<Client>) {
    let backoff = Backoff::default();
    loop {
        let Some((session, closed)) = client
            .upgrade()
            .map(|c| (c.current().session.clone(), c.closed.clone()))
        else {
            return;
        };
        let (ended, reconnected) = (session.ended.clone(), session.reconnected.clone());
        drop(session);
        tokio::select! {
            _ = closed.cancelled() => return,
            _ = ended.cancelled() => {}
            _ = reconnected.notified() => {}
        }
        let mut failures = 0;
        loop {
            let Some(strong) = client.upgrade() else {
                return;
            };
            if strong.is_closed() {
                return;
            }
            match strong.live().await {
                Ok(_) => break,
                Err(e) if e.is_retryable() => {
                    drop(strong);
                    tracing::debug!(error = %e, "no new zookeeper session yet; will retry");
                    tokio::select! {
                        _ = closed.cancelled() => return,
                        _ = tokio::time::sleep(backoff.delay(failures)) => {}
                    }
                    failures = failures.saturating_add(1);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a new zookeeper session");
                    return;
                }
            }
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
