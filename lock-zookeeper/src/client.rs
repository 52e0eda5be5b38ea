//! The store client: one ZooKeeper session at a time (a new one once it
//! ends), and the lock operations on it, each one short sequence of
//! requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::backend::{LockRequest, Wakeup};
use lockcore::{
    Attempt, Backoff, Capabilities, ExpiryClock, Fairness, FenceDurability, FencingToken, Holder,
    Lease, LeaseKind, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZooKeeperConfig;
use crate::error::{BACKEND, map};
use crate::held::{Held, Over, gone};
use crate::names::{NodeData, segment};
use crate::notify::Keeper;
use crate::queue::{Acls, Entry};
use crate::requests::{delete_node, list, retry};
use crate::session::{Session, Timing};

/// How many times inspect and evict look again when the holder changes
/// under them.
const LOOKS: usize = 8;

/// A session and the keeper that watches its longer-held grants.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) session: Arc<Session>,
    pub(crate) keeper: Arc<Keeper>,
}

impl Live {
    fn new(session: Arc<Session>) -> Arc<Live> {
        Arc::new(Live {
            keeper: Keeper::start(session.timeout, session.ended.clone()),
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
}

impl Client {
    /// Opens a session, creates the lock root if missing and checks that
    /// this client may queue under it.
    pub(crate) async fn open(config: ZooKeeperConfig) -> Result<Arc<Client>, LockError> {
        config.validate()?;
        let acls = Arc::new(Acls::new(config.digest.is_some()));
        let session = Session::open(&config).await?;
        let root = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acls.dirs));
        retry(|| session.client.mkdir(&config.root, &root))
            .await
            .map_err(|e| map(format!("creating the lock root {}", config.root), e))?;
        crate::probe::may_queue_under(&session.client, &config.root).await?;
        let client = Arc::new(Client {
            timeout_ms: AtomicU64::new(millis(session.timeout)),
            live: Mutex::new(Live::new(session)),
            reconnecting: tokio::sync::Mutex::new(()),
            acls,
            config,
        });
        tokio::spawn(keep_a_session(Arc::downgrade(&client)));
        Ok(client)
    }

    /// The current session, live or ended.
    pub(crate) fn current(&self) -> Arc<Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The live session, or a new one if it ended (expired: every lock it
    /// held is already gone on the server).
    pub(crate) async fn live(&self) -> Result<Arc<Live>, LockError> {
        let current = self.current();
        if !current.session.is_ended() {
            return Ok(current);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        let current = self.current();
        if !current.session.is_ended() {
            return Ok(current);
        }
        let old = &current.session;
        if old.client.state() == zk::SessionState::AuthFailed {
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
        // it (and its nodes): close it there.
        if old.client.state() == zk::SessionState::Expired {
            tokio::spawn(crate::session::reap(
                self.config.clone(),
                old.clone(),
                fresh,
            ));
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

    /// One attempt: enqueue, and keep the node only if it is first.
    pub(crate) async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let name = request.name();
        let live = self.live().await?;
        let mut entry = Entry::new(
            live.session.clone(),
            self.lock_path(name),
            self.acls.clone(),
            Some(request.label()),
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
            return Ok(Attempt::Acquired(self.grant(&live, name, entry, alone)?));
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
    /// [`Timing::new`]). A read answered by a follower proves nothing of the
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

    /// The head of `name`'s queue, read after a `sync`: its path and holder.
    async fn head(
        &self,
        session: &Session,
        name: &LockName,
    ) -> Result<Option<(String, Holder)>, LockError> {
        let parent = self.lock_path(name);
        for _ in 0..LOOKS {
            let queue = list(&session.client, &parent, true).await?;
            let Some(head) = queue.head() else {
                return Ok(None);
            };
            let path = format!("{parent}/{}", head.name);
            let read = match retry(|| session.client.get_data(&path)).await {
                Ok(read) => read,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map(format!("reading {path}"), e)),
            };
            let (data, stat) = read;
            let data = NodeData::decode(&data);
            let holder = Holder::new(
                data.fence(stat.czxid)?,
                Some(OwnerToken::from_uuid(head.guid)),
                None,
            )
            .with_label(data.label);
            return Ok(Some((path, holder)));
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("the holder of {parent} kept changing while being read"),
        ))
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let live = self.live().await?;
        Ok(self.head(&live.session, name).await?.map(|(_, h)| h))
    }

    /// Deletes the head of the queue (if its fence is `expected`, when given).
    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let live = self.live().await?;
        for _ in 0..LOOKS {
            let Some((path, current)) = self.head(&live.session, name).await? else {
                return Ok(None);
            };
            if expected.is_some_and(|fence| fence != current.fence) {
                return Ok(None);
            }
            // The path names one grant (its owner's uuid and sequence), so
            // this deletes exactly the holder just read.
            if delete_node(&live.session.client, &path)
                .await
                .map_err(|e| map(format!("force-releasing {path}"), e))?
            {
                return Ok(Some(current));
            }
        }
        Ok(None)
    }

    /// A wake-up once the head of `name`'s queue is gone (at once if the
    /// queue is empty): an `exists` watch on it, as the session's waiters
    /// watch the node ahead of theirs.
    pub(crate) async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let live = self.live().await?;
        let client = &live.session.client;
        let parent = self.lock_path(name);
        let queue = list(client, &parent, false).await?;
        let Some(head) = queue.head() else {
            return Ok(Some(Box::pin(async {})));
        };
        let path = format!("{parent}/{}", head.name);
        match client.check_and_watch_stat(&path).await {
            Ok((Some(_), watcher)) => Ok(Some(Box::pin(async move {
                watcher.changed().await;
            }))),
            Ok((None, _)) => Ok(Some(Box::pin(async {}))),
            Err(e) => Err(map(format!("watching {path}"), e)),
        }
    }

    /// Raises the fence floor of this client's lock root (see
    /// [`crate::floor`]).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let live = self.live().await?;
        crate::floor::raise(
            &live.session.client,
            &self.config.root,
            &self.acls.dirs,
            floor,
        )
        .await
    }
}

/// Opens a new session as soon as the current one ends, not only at the
/// next call, so that a session this client gave up is closed on the
/// servers promptly (see [`crate::session::reap`]). Stops with the backend.
async fn keep_a_session(client: Weak<Client>) {
    let backoff = Backoff::default();
    loop {
        let Some(ended) = client.upgrade().map(|c| c.current().session.ended.clone()) else {
            return;
        };
        ended.cancelled().await;
        let mut failures = 0;
        loop {
            let Some(strong) = client.upgrade() else {
                return;
            };
            match strong.live().await {
                Ok(_) => break,
                Err(e) if e.is_retryable() => {
                    drop(strong);
                    tracing::debug!(error = %e, "no new zookeeper session yet; will retry");
                    tokio::time::sleep(backoff.delay(failures)).await;
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
