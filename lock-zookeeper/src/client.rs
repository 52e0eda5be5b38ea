//! The store client: one ZooKeeper session at a time (a new one once it
//! ends), and the lock operations on it, each one short sequence of
//! requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::backend::{CancellationToken, Cleanups, LockRequest};
use lockcore::{
    Attempt, Backoff, Capabilities, ExpiryClock, Fairness, FenceDurability, FencingToken, Lease,
    LeaseKind, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use zookeeper_client as zk;

use crate::acls::Acls;
use crate::config::ZooKeeperConfig;
use crate::error::{BACKEND, map};
use crate::held::{Held, Over, gone};
use crate::names::segment;
use crate::notify::Keeper;
use crate::queue::Entry;
use crate::requests::retry;
use crate::session::{Session, Timing};

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
        let acls = Arc::new(Acls::new(config.digest.is_some()));
        let session = Session::open(&config).await?;
        let root = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acls.dirs));
        let creating = |e| map(format!("creating the lock root {}", config.root), e);
        let handle = session.client().map_err(creating)?;
        retry(|| handle.mkdir(&config.root, &root))
            .await
            .map_err(creating)?;
        crate::probe::may_queue_under(&handle, &config.root).await?;
        drop(handle);
        let client = Arc::new(Client {
            timeout_ms: AtomicU64::new(millis(session.timeout)),
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
    /// use (see [`crate::floor`]).
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
                (self.cleanups).spawn(crate::session::reap(config, old.clone(), fresh));
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

    /// The ZooKeeper path of `name`'s queue: one child of the root.
    pub(crate) fn lock_path(&self, name: &LockName) -> String {
        format!("{}/{}", self.config.root, segment(name))
    }

    pub(crate) fn capabilities(&self) -> Capabilities {
        let timeout = self.session_timeout();
        let timing = Timing::new(timeout, &self.config);
        // Any TTL from 1 ms to a year is accepted and means the session
        // timeout, which `LeaseKind::Session` declares and every lease reports.
        Capabilities::new(BACKEND)
            .expiry_clock(ExpiryClock::Session)
            .lease_kind(LeaseKind::Session { timeout })
            .fairness(Fairness::Fifo)
            .fence_durability(FenceDurability::Durable)
            .notifications(true)
            // A forced release deletes the holder's node, which its session
            // watches from a sixteenth of the timeout after the grant on.
            .eviction_notice(Some(Keeper::watched_within(timeout)))
            // 7/5 of the timeout + 1.5 ticks (see `Timing::new`).
            .expiry_slack(timing.slack)
            .fence_floor(true)
            // A fence is a `czxid` (at most `i64::MAX`) plus the floor's
            // offset, summed in 64 unsigned bits. Declaring the signed range
            // keeps `2^63` of room above any accepted floor for `czxid`s to
            // grow (a leader election alone moves them by `2^32`), so no floor
            // accepted here makes later grants overflow.
            .max_fence(i64::MAX as u64)
            .semaphores(true)
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
        let limit = self.session_timeout();
        lockcore::backend::timed(BACKEND, &format!("{what} {name}"), limit, op).await
    }

    /// The lease's node, if `lease` is a grant of this backend kind that
    /// matches its own fields (a forged lease has none).
    pub(crate) fn held<'l>(&self, lease: &'l Lease) -> Option<&'l Arc<Held>> {
        lease.extension::<Arc<Held>>().filter(|h| {
            h.name == *lease.name() && h.guid == lease.owner().as_uuid() && h.fence == lease.fence()
        })
    }

    /// One attempt: enqueue, and keep the node only if it is first. Made
    /// once more on a new session if the session ended under it (retired
    /// for a raised fence floor, or expired).
    pub(crate) async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let live = self.live().await?;
        match self.try_acquire_on(&live, request).await {
            Err(_) if live.session.is_ended() && !self.is_closed() => {
                let live = self.live().await?;
                self.try_acquire_on(&live, request).await
            }
            other => other,
        }
    }

    /// [`try_acquire`](Self::try_acquire) on the session of `live`.
    async fn try_acquire_on(
        &self,
        live: &Live,
        request: &LockRequest,
    ) -> Result<Attempt, LockError> {
        let name = request.name();
        let mut entry = Entry::new(
            live.session.clone(),
            self.lock_path(name),
            self.acls.clone(),
            self.cleanups.clone(),
            Some(request),
        );
        let Some(mut queue) = entry.enqueue(true).await? else {
            return Err(LockError::store(
                BACKEND,
                "a listed enqueue returned no queue",
            ));
        };
        if let Some(fresh) = entry.prune(&queue).await? {
            queue = fresh;
        }
        let ours = entry.name().unwrap_or_default();
        if queue.position(ours) == Some(0) {
            let alone = queue.is_only(ours);
            if !entry.prove_recent().await? {
                return Err(vanished(name));
            }
            return Ok(Attempt::Acquired(self.grant(live, name, entry, alone)?));
        }
        if let Err(e) = entry.remove().await {
            tracing::debug!(%name, error = %e, "could not remove a queue node now; retrying in the background");
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Turns the head of the queue into a lease, starting at the node's
    /// `alive_since`: the send time of a request that went through the leader
    /// (a write or a `sync`), so the leader keeps the session (and the node)
    /// until `alive_since + timeout`, less the session's margin (see
    /// [`Timing::new`]). The lease is judged on the clock that time was read
    /// on, the request's. A read answered by a follower proves nothing of the
    /// kind: a follower cut off from the leader keeps answering for a while.
    /// Callers make that start recent first ([`Entry::prove_recent`]).
    /// `alone`: the latest look at the queue showed only our node, so nobody
    /// else is waiting and the next create here is likely ours again (the
    /// release then vouches for its number; see [`crate::quiet`]).
    pub(crate) fn grant(
        &self,
        live: &Live,
        name: &LockName,
        entry: Entry,
        alone: bool,
    ) -> Result<Lease, LockError> {
        self.grant_slot(live, name, entry, alone, None)
    }

    /// [`grant`](Self::grant) of a semaphore's `slot` (a lock: `None`).
    pub(crate) fn grant_slot(
        &self,
        live: &Live,
        name: &LockName,
        entry: Entry,
        alone: bool,
        slot: Option<u32>,
    ) -> Result<Lease, LockError> {
        let node = entry
            .node
            .as_ref()
            .ok_or_else(|| LockError::store(BACKEND, "granted a queue entry without a node"))?;
        let (fence, alive_since) = (node.fence()?, node.alive_since);
        let session = entry.session.clone();
        // Whatever was asked, a lease lasts the negotiated session timeout.
        let ttl = self.capabilities().effective_ttl(session.timeout)?;
        let lease = Lease::new(
            name.clone(),
            OwnerToken::from_uuid(entry.guid),
            fence,
            ttl,
            alive_since,
        )
        .with_clock(entry.clock.clone())
        .with_extra_margin(session.timing.margin);
        let held = Held::start(entry, name.clone(), fence, alone, lease.deadline())
            .ok_or_else(|| LockError::store(BACKEND, "granted a queue entry without a node"))?;
        live.keeper.add(held.clone());
        let lease = lease
            .with_loss_signal(held.lost.clone())
            .with_extension(held);
        Ok(match slot {
            Some(slot) => lease.with_slot(slot),
            None => lease,
        })
    }

    /// Deletes the grant's node if it is still this lease's.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.refuse_closed()?;
        let Some(held) = self.held(lease) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        if held.expire_if_due(Instant::now()) {
            let _ = held.delete().await;
            return Ok(ReleaseOutcome::NotHeld);
        }
        if held.over() != Over::No {
            return Ok(ReleaseOutcome::NotHeld);
        }
        if held.session.is_ended() {
            gone(held);
            return Ok(ReleaseOutcome::NotHeld);
        }
        held.releasing();
        let deleted = held
            .delete()
            .await
            .map_err(|e| map(format!("releasing {}", held.path), e))?;
        held.finish(Over::Released);
        held.stop();
        if let Some(sequence) = held.sequence {
            held.session.lines.deleted(&held.parent, sequence);
        }
        // The node is gone (the server answered): a create sent from now on
        // that gets the next number is first.
        if let Some((watch, sequence)) = held.vouch {
            held.session.quiet.vouch(&held.parent, watch, sequence);
        }
        Ok(if deleted {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Raises the fence floor of this client's lock root (see
    /// [`crate::floor`]).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.capabilities().check_fence_floor(floor)?;
        let live = self.live().await?;
        let raising = |e| {
            map(
                format!("raising the fence floor of {}", self.config.root),
                e,
            )
        };
        crate::floor::raise(
            &live.session.client().map_err(raising)?,
            &self.config.root,
            &self.acls.dirs,
            floor,
        )
        .await
    }
}

/// Opens a new session as soon as the current one ends, not only at the
/// next call, so that a session this client gave up (or retired) is closed
/// on the servers promptly (see [`crate::session::reap`]). After each
/// reconnection, looks at once whether the fence floor was raised meanwhile
/// (a restore), so that a session resumed from before the floor is retired
/// and closed with the nodes it had then (see [`crate::floor`]). Stops with
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
