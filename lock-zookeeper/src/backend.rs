//! `ZooKeeperBackend`: the queue recipe behind the `LockBackend` contract.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::{LockRequest, Moment, WaitPolicy, Wakeup};
use lockcore::{
    Attempt, Backoff, Capabilities, ExpiryClock, Fairness, FenceDurability, FencingToken, Holder,
    Lease, LeaseKind, LockBackend, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZooKeeperConfig;
use crate::error::{BACKEND, map, transient};
use crate::held::{Held, Keeper, Over, gone};
use crate::names::segment;
use crate::queue::{Acls, Entry, delete_node, list, retry};
use crate::session::{Session, Timing};

/// A ZooKeeper lock client: one session, shared by its clones.
///
/// See the crate documentation for the recipe and what it guarantees.
#[derive(Clone)]
pub struct ZooKeeperBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZooKeeperConfig,
    acls: Arc<Acls>,
    session: Mutex<Arc<Session>>,
    reconnecting: tokio::sync::Mutex<()>,
    /// The latest negotiated session timeout, for `capabilities()`.
    timeout_ms: AtomicU64,
}

/// How many times inspect and force_release look again when the holder
/// changes under them.
const LOOKS: usize = 8;

impl ZooKeeperBackend {
    /// Bounds one operation by the session timeout. A request the server
    /// never answers while the connection stays up (its bytes lost on the
    /// way) would otherwise wait forever; past the session timeout, any
    /// lease it was for has run out on the client's clock anyway. Dropping
    /// the operation cleans up as a cancelled one does (a queue node is
    /// removed in the background).
    async fn bounded<T>(
        &self,
        what: &str,
        name: &LockName,
        op: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        let limit = self.session_timeout();
        tokio::time::timeout(limit, op).await.unwrap_or_else(|_| {
            Err(LockError::unavailable(
                BACKEND,
                format!(
                    "{what} {name}: no answer from ZooKeeper within the session timeout ({limit:?})"
                ),
            ))
        })
    }

    /// One attempt: enqueue, and keep the node only if it is first.
    async fn attempt(&self, name: &LockName) -> Result<Attempt, LockError> {
        let session = self.inner.session().await?;
        let mut entry = Entry::new(session, self.lock_path(name), self.inner.acls.clone());
        // The create is a write: it went through the leader after this.
        let sent_at = Moment::now();
        let mut queue = entry.enqueue().await?;
        if let Some(fresh) = entry.prune(&queue).await? {
            queue = fresh;
        }
        let ours = entry.name().unwrap_or_default();
        if queue.position(ours) == Some(0) {
            let alone = queue.is_only(ours);
            return Ok(Attempt::Acquired(self.grant(name, entry, sent_at, alone)?));
        }
        if let Err(e) = entry.remove().await {
            tracing::debug!(%name, error = %e, "could not remove a queue node now; retrying in the background");
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Deletes the grant's node if it is still this lease's.
    async fn release_now(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
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

    /// Connects with a `zk://` URL or a plain connect string (see
    /// [`ZooKeeperConfig::from_url`]).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL; [`LockError::Unavailable`]
    /// when no server answers; [`LockError::Store`] when the lock root cannot
    /// be created (an ACL of another identity).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(ZooKeeperConfig::from_url(url)?).await
    }

    /// Connects with `config`: opens a session and creates the lock root if
    /// it is missing.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: ZooKeeperConfig) -> Result<Self, LockError> {
        config.validate()?;
        let acls = Arc::new(Acls::new(config.digest.is_some()));
        let session = Session::open(&config).await?;
        let root = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acls.dirs));
        retry(|| session.client.mkdir(&config.root, &root))
            .await
            .map_err(|e| map(format!("creating the lock root {}", config.root), e))?;
        may_queue_under(&session.client, &config.root).await?;
        let inner = Arc::new(Inner {
            timeout_ms: AtomicU64::new(millis(session.timeout)),
            session: Mutex::new(session),
            reconnecting: tokio::sync::Mutex::new(()),
            acls,
            config,
        });
        tokio::spawn(keep_a_session(Arc::downgrade(&inner)));
        Ok(ZooKeeperBackend { inner })
    }

    /// The configuration.
    pub fn config(&self) -> &ZooKeeperConfig {
        &self.inner.config
    }

    /// The session timeout the server granted: the TTL of every lease.
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.timeout_ms.load(Ordering::Relaxed))
    }

    /// The client of the current session, for diagnostics and tests (its
    /// [`session`](zk::Client::session) identifies the owner of this
    /// backend's lock nodes).
    pub fn zk_client(&self) -> zk::Client {
        self.inner.current().client.clone()
    }

    /// The ZooKeeper path of `name`'s queue: one child of the root.
    pub fn lock_path(&self, name: &LockName) -> String {
        format!("{}/{}", self.inner.config.root, segment(name))
    }

    /// The lease's node, if `lease` is a grant of this backend kind that
    /// matches its own fields (a forged lease has none).
    fn held<'l>(&self, lease: &'l Lease) -> Option<&'l Arc<Held>> {
        lease.extension::<Arc<Held>>().filter(|h| {
            h.name == *lease.name() && h.guid == lease.owner().as_uuid() && h.fence == lease.fence()
        })
    }

    /// Turns the head of the queue into a lease. `alive_since`: the send time
    /// of a request that went through the leader (a write or a `sync`), so
    /// the leader keeps the session (and the node) until `alive_since +
    /// timeout`, less the session's margin (see [`Timing::new`]). A read
    /// answered by a follower proves nothing of the kind: a follower cut off
    /// from the leader keeps answering for a while. `alone`: the latest look at the queue showed
    /// only our node, so nobody else is waiting and the next create here is
    /// likely ours again (the release then vouches for its number; see
    /// [`crate::quiet`]).
    fn grant(
        &self,
        name: &LockName,
        entry: Entry,
        alive_since: Moment,
        alone: bool,
    ) -> Result<Lease, LockError> {
        let czxid = entry.node.as_ref().map_or(0, |n| n.czxid);
        let Some(fence) = u64::try_from(czxid).ok().and_then(FencingToken::new) else {
            return Err(LockError::store(
                BACKEND,
                format!(
                    "lock node under {} has no valid czxid ({czxid})",
                    entry.parent
                ),
            ));
        };
        let (session, parent, guid, strays, watched) = (
            entry.session.clone(),
            entry.parent.clone(),
            entry.guid,
            entry.strays,
            entry.watched,
        );
        let node = entry
            .granted()
            .ok_or_else(|| LockError::store(BACKEND, "granted a queue entry without a node"))?;
        let vouch = watched.zip(node.sequence).filter(|_| alone);
        // Whatever was asked, a lease lasts the negotiated session timeout.
        let ttl = self.capabilities().effective_ttl(session.timeout)?;
        let lease = Lease::new(
            name.clone(),
            OwnerToken::from_uuid(guid),
            fence,
            ttl,
            alive_since,
        )
        .with_extra_margin(session.timing.margin);
        let held = Held::start(
            session,
            name.clone(),
            parent,
            node.path,
            guid,
            fence,
            strays,
            vouch,
            lease.deadline(),
        );
        Ok(lease
            .with_loss_signal(held.lost.clone())
            .with_extension(held))
    }

    /// Waits in line until granted, the deadline, or an error retrying
    /// cannot fix.
    async fn wait_in_line(
        &self,
        name: &LockName,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let parent = self.lock_path(name);
        let mut failures: u32 = 0;
        // Sleeps after a transient failure; `Err` once the deadline passed.
        let pause = |failures: &mut u32, e: LockError| {
            let delay = wait.backoff.delay(*failures);
            *failures = failures.saturating_add(1);
            let now = Instant::now();
            async move {
                if now >= wait.deadline {
                    return Err(e);
                }
                tracing::debug!(%name, error = %e, "waiting for a lock: store trouble, will retry");
                tokio::time::sleep_until((now + delay).min(wait.deadline)).await;
                Ok(())
            }
        };
        'session: loop {
            let session = match self.inner.session().await {
                Ok(session) => session,
                Err(e) if e.is_retryable() => {
                    pause(&mut failures, e).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut entry = Entry::new(session.clone(), parent.clone(), self.inner.acls.clone());
            // The send time of this entry's latest request that went through
            // the leader: the create (a write), then each synced listing.
            let mut alive_since = Moment::now();
            let mut queue = match entry.enqueue().await {
                Ok(queue) => queue,
                Err(e) if e.is_retryable() => {
                    pause(&mut failures, e).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            loop {
                match entry.prune(&queue).await {
                    Ok(Some(fresh)) => queue = fresh,
                    Ok(None) => {}
                    Err(e) if e.is_retryable() => {
                        pause(&mut failures, e).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                let ours = entry.name().unwrap_or_default().to_owned();
                let at = match queue.position(&ours) {
                    Some(0) => {
                        let alone = queue.is_only(&ours);
                        return self.grant(name, entry, alive_since, alone).map(Some);
                    }
                    Some(at) => at,
                    // Our node is gone (its session ended, or it was deleted
                    // by hand): queue again.
                    None if Instant::now() >= wait.deadline => return Ok(None),
                    None => continue 'session,
                };
                if Instant::now() >= wait.deadline {
                    if let Err(e) = entry.remove().await {
                        tracing::debug!(%name, error = %e, "could not remove a timed-out queue node now; retrying in the background");
                    }
                    return Ok(None);
                }
                // Watch only the node just ahead: one waiter wakes per release.
                let ahead = queue
                    .predecessor(&ours)
                    .map(|n| format!("{parent}/{}", n.name))
                    .unwrap_or_default();
                // Nodes ahead of ours only ever go away (sequence numbers
                // grow), so once the only node ahead is gone, we are first.
                let next_in_line = at == 1;
                // An `exists` is answered by our server alone: it does not
                // move `alive_since`.
                let ahead_gone = match session.client.check_and_watch_stat(&ahead).await {
                    Ok((Some(_), watcher)) => {
                        let recheck = (Instant::now() + wait.recheck).min(wait.deadline);
                        tokio::select! {
                            event = watcher.changed() => event.event_type == zk::EventType::NodeDeleted,
                            _ = tokio::time::sleep_until(recheck) => false,
                            _ = session.ended.cancelled() => false,
                        }
                    }
                    Ok((None, _)) => true,
                    Err(e) if transient(&e) => {
                        pause(&mut failures, map("watching the queue", e)).await?;
                        false
                    }
                    Err(e) => return Err(map(format!("watching {ahead}"), e)),
                };
                if session.is_ended() {
                    continue 'session;
                }
                // Fast path: no read needed, as long as the leader heard of
                // the session recently enough to leave a useful deadline.
                let fresh = Moment::now().since(alive_since) <= session.timeout / 4;
                if ahead_gone && next_in_line && fresh {
                    return self.grant(name, entry, alive_since, false).map(Some);
                }
                // Synced: the listing's send time becomes the grant's start,
                // which only a request through the leader can vouch for (a
                // cut-off follower answers plain reads for a while).
                let sent = Moment::now();
                queue = match entry.relist(true).await {
                    Ok(queue) => {
                        alive_since = sent;
                        queue
                    }
                    Err(e) if e.is_retryable() => {
                        pause(&mut failures, e).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
            }
        }
    }
}

impl Inner {
    fn current(&self) -> Arc<Session> {
        self.session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The live session, or a new one if it ended (expired: every lock it
    /// held is already gone on the server).
    async fn session(&self) -> Result<Arc<Session>, LockError> {
        let current = self.current();
        if !current.is_ended() {
            return Ok(current);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        let current = self.current();
        if !current.is_ended() {
            return Ok(current);
        }
        if current.client.state() == zk::SessionState::AuthFailed {
            return Err(LockError::store(
                BACKEND,
                "ZooKeeper refused the session's credentials (AuthFailed)",
            ));
        }
        tracing::info!(timeout = ?current.timeout, "zookeeper session ended; opening a new one");
        let fresh = Session::open(&self.config).await?;
        self.timeout_ms
            .store(millis(fresh.timeout), Ordering::Relaxed);
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        // Expired here may mean given up here while the servers still keep
        // it (and its nodes): close it there.
        if current.client.state() == zk::SessionState::Expired {
            tokio::spawn(crate::session::reap(
                self.config.clone(),
                current,
                fresh.clone(),
            ));
        }
        Ok(fresh)
    }
}

/// Opens a new session as soon as the current one ends, not only at the
/// next call, so that a session this client gave up is closed on the
/// servers promptly (see [`crate::session::reap`]). Stops with the backend.
async fn keep_a_session(inner: Weak<Inner>) {
    let backoff = Backoff::default();
    loop {
        let Some(ended) = inner.upgrade().map(|i| i.current().ended.clone()) else {
            return;
        };
        ended.cancelled().await;
        let mut failures = 0;
        loop {
            let Some(live) = inner.upgrade() else {
                return;
            };
            match live.session().await {
                Ok(_) => break,
                Err(e) if e.is_retryable() => {
                    drop(live);
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

/// Refuses a client that may not create and delete nodes under the lock
/// root (another identity's root: wrong or missing digest credentials),
/// which would fail every acquire with `NoAuth`: better said at connect.
/// The server judges: an ephemeral probe node is created and deleted.
async fn may_queue_under(client: &zk::Client, root: &str) -> Result<(), LockError> {
    // A bare `%` starts no percent-escape: no lock name has this segment.
    let probe = format!("{root}/%probe-{}", uuid::Uuid::new_v4().simple());
    let mode = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let checking = |e| map(format!("checking access to the lock root {root}"), e);
    let refused = match retry(|| client.create(&probe, &[], &mode)).await {
        Ok(_) | Err(zk::Error::NodeExists) => match delete_node(client, &probe).await {
            Ok(_) => return Ok(()),
            Err(zk::Error::NoAuth) => "delete",
            Err(e) => return Err(checking(e)),
        },
        Err(zk::Error::NoAuth) => "create",
        Err(e) => return Err(checking(e)),
    };
    // Digest ids carry a password hash: name users only.
    let user = |scheme: &str, id: &str| match scheme {
        "digest" => format!("digest:{}", id.split(':').next().unwrap_or_default()),
        _ => format!("{scheme}:{id}"),
    };
    let needed = zk::Permission::CREATE | zk::Permission::DELETE;
    let owners = match client.get_acl(root).await {
        Ok((acl, _)) => (acl.iter())
            .filter(|a| a.permission().has(needed))
            .map(|a| user(a.scheme(), a.id()))
            .collect::<Vec<_>>()
            .join(", "),
        Err(_) => String::new(),
    };
    let me = match client.list_auth_users().await {
        Ok(me) => me
            .iter()
            .map(|u| user(u.scheme(), u.user()))
            .collect::<Vec<_>>()
            .join(", "),
        Err(_) => String::new(),
    };
    Err(LockError::store(
        BACKEND,
        format!(
            "ZooKeeper does not let this client ({}) {refused} nodes under the lock root {root}, \
             whose ACL lets only {} create and delete there: check the digest credentials \
             (user:password; a wrong password is another identity with the same user name)",
            if me.is_empty() {
                "identity unknown"
            } else {
                &me
            },
            if owners.is_empty() { "nobody" } else { &owners },
        ),
    ))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("config", &self.inner.config)
            .field("session", &self.inner.current())
            .finish()
    }
}

#[async_trait]
impl LockBackend for ZooKeeperBackend {
    fn capabilities(&self) -> Capabilities {
        let timeout = self.session_timeout();
        let timing = Timing::new(timeout, &self.inner.config);
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
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let name = request.name();
        self.bounded("acquiring", name, self.attempt(name)).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let not_held = || LockError::NotHeld {
            name: lease.name().clone(),
        };
        let Some(held) = self.held(lease) else {
            return Err(not_held());
        };
        let sent_at = Moment::now();
        if held.expire_if_due(sent_at.mono()) {
            let _ = held.delete().await;
            return Err(not_held());
        }
        if held.over() != Over::No || held.session.is_ended() {
            return Err(not_held());
        }
        // `sync` then a read of the node: the session's server was in touch
        // with the leader after `sent_at` (the lease keeps its margin for
        // what the leader may not have heard), and the node is still this
        // grant's.
        let client = &held.session.client;
        let synced = client.sync(&held.path);
        let stat = client.check_stat(&held.path);
        let outcome = match synced.await {
            Ok(()) | Err(zk::Error::NoNode) => stat.await,
            Err(e) => Err(e),
        };
        let stat = match outcome {
            Ok(stat) => stat,
            Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                gone(held);
                return Err(not_held());
            }
            Err(e) => return Err(map(format!("renewing {}", held.path), e)),
        };
        let ours = stat.is_some_and(|s| {
            u64::try_from(s.czxid).ok() == Some(lease.fence().get())
                && s.ephemeral_owner == held.session.id()
        });
        if !ours {
            gone(held);
            return Err(not_held());
        }
        let renewed = lease.renewed(sent_at);
        if !held.extend(Instant::now(), renewed.deadline()) {
            return Err(not_held());
        }
        Ok(renewed)
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.bounded("releasing", lease.name(), self.release_now(lease))
            .await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let session = self.inner.session().await?;
        let parent = self.lock_path(name);
        for _ in 0..LOOKS {
            let queue = list(&session.client, &parent, true).await?;
            let Some(head) = queue.head() else {
                return Ok(None);
            };
            let path = format!("{parent}/{}", head.name);
            let stat = retry(|| session.client.check_stat(&path))
                .await
                .map_err(|e| map(format!("reading {path}"), e))?;
            if let Some(stat) = stat {
                return Ok(Some(holder(&path, head.guid, &stat)?));
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("the holder of {parent} kept changing while being read"),
        ))
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let session = self.inner.session().await?;
        let parent = self.lock_path(name);
        let mut evicted = None;
        for _ in 0..LOOKS {
            let queue = list(&session.client, &parent, true).await?;
            let Some(head) = queue.head() else {
                break;
            };
            let path = format!("{parent}/{}", head.name);
            let stat = retry(|| session.client.check_stat(&path))
                .await
                .map_err(|e| map(format!("reading {path}"), e))?;
            let Some(stat) = stat else {
                continue;
            };
            let current = holder(&path, head.guid, &stat)?;
            if expected.is_some_and(|fence| fence != current.fence) {
                break;
            }
            // The path names one grant (its owner's uuid and sequence), so
            // this deletes exactly the holder just read.
            if delete_node(&session.client, &path)
                .await
                .map_err(|e| map(format!("force-releasing {path}"), e))?
            {
                evicted = Some(current);
                break;
            }
        }
        Ok(evicted)
    }

    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let session = self.inner.session().await?;
        let parent = self.lock_path(name);
        let queue = list(&session.client, &parent, false).await?;
        let Some(head) = queue.head() else {
            return Ok(Some(Box::pin(async {})));
        };
        let path = format!("{parent}/{}", head.name);
        match session.client.check_and_watch_stat(&path).await {
            Ok((Some(_), watcher)) => Ok(Some(Box::pin(async move {
                watcher.changed().await;
            }))),
            Ok((None, _)) => Ok(Some(Box::pin(async {}))),
            Err(e) => Err(map(format!("watching {path}"), e)),
        }
    }

    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let name = request.name();
        // Requests wait out a disconnection; never let one hold the caller
        // past its deadline (dropping the queue entry removes its node).
        let stuck = wait.deadline + Duration::from_millis(250);
        match tokio::time::timeout_at(stuck, self.wait_in_line(name, wait)).await {
            Ok(outcome) => outcome,
            Err(_) => Ok(None),
        }
    }
}

fn holder(path: &str, guid: uuid::Uuid, stat: &zk::Stat) -> Result<Holder, LockError> {
    let fence = u64::try_from(stat.czxid)
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| LockError::store(BACKEND, format!("{path} has no valid czxid")))?;
    Ok(Holder::new(fence, Some(OwnerToken::from_uuid(guid)), None))
}
