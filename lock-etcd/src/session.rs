//! Sessions: the etcd leases a client attaches its lock entries and permits
//! to, one per TTL, each kept alive on one keep-alive stream, and the
//! client's book of what it attached to them.
//!
//! A lock is a key attached to a session, not a lease of its own, so
//! renewing 10,000 locks is one keep-alive and one check, not 10,000 of
//! each. The price: refreshing a session extends every key on it, renewed
//! or not, so the client keeps each key's own expiry itself. Each held key
//! is paid up to its last renewal's send time + its TTL; a key whose time
//! runs out unrenewed (a lock nobody renews, a wait cancelled while the
//! store was out of reach) is deleted by the keeper at that moment, which
//! is never before its holder's local deadline. While the client runs, every
//! lock thus expires on its own TTL; once it stops (crash, partition), no
//! refresh follows and etcd drops the whole session one TTL after the last
//! one, on its own lease timer.
//!
//! A session on which a write got no answer (it may land later, unseen) is
//! retired: never refreshed again, so whatever landed goes with it within a
//! TTL. Its waiting entries move to a fresh session at once, its held locks
//! at their next renewal (a put that keeps the key and its create revision),
//! and locks nobody renews go with it. A session etcd reports gone (expired,
//! revoked) takes every entry on it: each held lock's loss signal fires.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
};
use lockcore::LockError;
use lockcore::backend::CancellationToken;
use tokio::time::Instant;

use crate::error::{self, BACKEND, lease_not_found, timed};
use crate::keys::Keys;

/// How often the keeper looks at the book.
const TICK: Duration = Duration::from_millis(100);
/// How long a session nothing is attached to is kept for the next lock.
const IDLE: Duration = Duration::from_secs(5);
/// Entries moved off a retired session per transaction (each a nested
/// transaction: etcd allows 128 operations per branch).
const MOVE_BATCH: usize = 128;

/// How far a session may be from its last refresh and still take a new
/// entry without one: a new grant then gets at least 3/4 of its TTL.
pub(crate) fn fresh_enough(ttl: Duration) -> Duration {
    ttl / 4
}

/// A session a new key is being written to: the keeper keeps it (and does
/// not revoke it) until this is dropped.
pub(crate) struct Use {
    pub(crate) session: Arc<Session>,
    /// When its lease was last refreshed (a new entry's lease counts from then).
    pub(crate) refreshed: Instant,
    sessions: Arc<Sessions>,
}

impl Drop for Use {
    fn drop(&mut self) {
        if let Some(state) = self.sessions.book().sessions.get_mut(&self.session.id) {
            state.users = state.users.saturating_sub(1);
        }
    }
}

/// One session lease.
pub(crate) struct Session {
    pub(crate) id: i64,
    pub(crate) ttl: Duration,
    /// The keep-alive stream, opened on first use, reopened after a failure.
    stream: tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// Cancelled when the session is gone from the book (stops its notices).
    pub(crate) ended: CancellationToken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Live,
    /// Never refreshed again (a write on it got no answer).
    Retired,
    /// etcd says the lease is gone.
    Dead,
}

/// What one key in the book is.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// A place in a queue: kept alive while its waiter waits.
    Waiting,
    /// A grant: alive until `paid_until` unless renewed.
    Held { paid_until: Instant },
    /// To be deleted (a cancelled wait whose cleanup failed): alive until
    /// `paid_until` at most.
    Doomed { paid_until: Instant },
}

/// A key to move to another session: its create revision and value.
#[derive(Debug, Clone)]
pub(crate) struct Attached {
    pub(crate) key: Vec<u8>,
    pub(crate) revision: i64,
    pub(crate) value: Arc<[u8]>,
}

/// A key this client attached to one of its sessions.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) session: i64,
    pub(crate) revision: i64,
    pub(crate) value: Arc<[u8]>,
    pub(crate) kind: Kind,
    /// A grant's loss signal.
    pub(crate) lost: CancellationToken,
    /// The queue and entry number the key is named after (none for permit slots).
    pub(crate) number: Option<(Vec<u8>, u32)>,
}

struct SessionState {
    handle: Arc<Session>,
    refreshed: Instant,
    status: Status,
    /// Entry numbers in use per queue.
    numbers: HashMap<Vec<u8>, BTreeSet<u32>>,
    /// Whether the keeper is refreshing it or moving its waiting entries.
    busy: bool,
    /// Since when it carries no key.
    empty_since: Option<Instant>,
    /// Writes of new keys on their way to it (see [`Use`]).
    users: usize,
}

#[derive(Default)]
struct Book {
    current: HashMap<Duration, i64>,
    sessions: HashMap<i64, SessionState>,
    entries: HashMap<Vec<u8>, Entry>,
}

/// Called with every new session (to follow its eviction notices).
pub(crate) type OnSession = Box<dyn Fn(&Arc<Session>) + Send + Sync>;

/// Every session of one client and the book of its keys.
pub(crate) struct Sessions {
    client: Client,
    keys: Keys,
    timeout: Duration,
    on_session: OnSession,
    book: Mutex<Book>,
    /// Serializes session grants, so concurrent first uses share one.
    granting: tokio::sync::Mutex<()>,
    keeper: Mutex<bool>,
}

impl Sessions {
    pub(crate) fn new(
        client: Client,
        keys: Keys,
        timeout: Duration,
        on_session: OnSession,
    ) -> Self {
        Sessions {
            client,
            keys,
            timeout,
            on_session,
            book: Mutex::default(),
            granting: tokio::sync::Mutex::new(()),
            keeper: Mutex::new(false),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live session for new entries of `ttl`, refreshed first if it is
    /// not fresh enough, and when it was last refreshed (a new entry's lease
    /// counts from then). The keeper keeps it while the [`Use`] lives: hold
    /// it until the write's outcome is in the book.
    pub(crate) async fn for_entry(self: &Arc<Self>, ttl: Duration) -> Result<Use, LockError> {
        for _ in 0..3 {
            let session = self.current(ttl).await?;
            let Some(mut using) = self.claim(&session) else {
                continue;
            };
            if using.refreshed.elapsed() <= fresh_enough(ttl) {
                return Ok(using);
            }
            if let Some(sent) = self.refresh(&session).await? {
                using.refreshed = sent;
                return Ok(using);
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            "every new etcd session was gone at once",
        ))
    }

    async fn current(self: &Arc<Self>, ttl: Duration) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.live_current(ttl) {
            return Ok(session);
        }
        let _granting = self.granting.lock().await;
        if let Some(session) = self.live_current(ttl) {
            return Ok(session);
        }
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let sent = Instant::now();
        let granted = timed(
            self.timeout,
            "lease grant",
            self.client.lease_client().grant(secs, None),
        )
        .await?;
        if !granted.error().is_empty() {
            return Err(LockError::store(BACKEND, granted.error().to_owned()));
        }
        if granted.ttl() != secs {
            // The cluster's minimum changed under us: never hand out a lease
            // whose real TTL differs from what we report.
            self.spawn_revoke(granted.id());
            return Err(LockError::InvalidTtl {
                ttl,
                reason: format!(
                    "etcd granted {} s instead of {secs} s (its minimum lease TTL is larger)",
                    granted.ttl()
                ),
            });
        }
        // The marker goes with the lease: its delete tells this client at
        // once that the session (and every lock on it) is gone.
        let marker = TxnOp::put(
            self.keys.alive(granted.id()),
            Vec::new(),
            Some(PutOptions::new().with_lease(granted.id())),
        );
        if let Err(e) = timed(
            self.timeout,
            "session marker",
            self.client.kv_client().txn(Txn::new().and_then([marker])),
        )
        .await
        {
            self.spawn_revoke(granted.id());
            return Err(e);
        }
        let session = Arc::new(Session {
            id: granted.id(),
            ttl,
            stream: tokio::sync::Mutex::new(None),
            ended: CancellationToken::new(),
        });
        let mut book = self.book();
        book.sessions.insert(
            session.id,
            SessionState {
                handle: session.clone(),
                refreshed: sent,
                status: Status::Live,
                numbers: HashMap::new(),
                busy: false,
                empty_since: None,
                users: 0,
            },
        );
        book.current.insert(ttl, session.id);
        drop(book);
        (self.on_session)(&session);
        self.start_keeper();
        Ok(session)
    }

    fn live_current(&self, ttl: Duration) -> Option<Arc<Session>> {
        let book = self.book();
        let state = book.sessions.get(book.current.get(&ttl)?)?;
        (state.status == Status::Live).then(|| state.handle.clone())
    }

    /// Marks `session` in use (if it is live), with its last refresh.
    fn claim(self: &Arc<Self>, session: &Arc<Session>) -> Option<Use> {
        let mut book = self.book();
        let state = book.sessions.get_mut(&session.id)?;
        if state.status != Status::Live {
            return None;
        }
        state.users += 1;
        Some(Use {
            session: session.clone(),
            refreshed: state.refreshed,
            sessions: self.clone(),
        })
    }

    /// Restarts the session's TTL: one keep-alive on its stream, shared by
    /// every caller waiting meanwhile. `Some(sent)`: the lease lives at least
    /// until `sent` + TTL, `sent` taken after this call began. `None`: etcd
    /// says it is gone (or it was retired: it may not be refreshed).
    pub(crate) async fn refresh(&self, session: &Session) -> Result<Option<Instant>, LockError> {
        let asked = Instant::now();
        let mut stream = session.stream.lock().await;
        {
            let book = self.book();
            match book.sessions.get(&session.id) {
                Some(state) if state.status == Status::Live => {
                    if state.refreshed >= asked {
                        return Ok(Some(state.refreshed));
                    }
                }
                _ => return Ok(None),
            }
        }
        let sent = Instant::now();
        let outcome = tokio::time::timeout(self.timeout, async {
            match stream.as_mut() {
                Some((keeper, replies)) => {
                    keeper.keep_alive().await?;
                    match replies.message().await? {
                        Some(reply) => Ok(reply.ttl() > 0),
                        None => Err(etcd_client::Error::WatchError(
                            "keep-alive stream closed".into(),
                        )),
                    }
                }
                None => match self.client.lease_client().keep_alive(session.id).await {
                    Ok(opened) => {
                        *stream = Some(opened);
                        Ok(true)
                    }
                    Err(e) if lease_not_found(&e) => Ok(false),
                    Err(e) => Err(e),
                },
            }
        })
        .await;
        match outcome {
            Ok(Ok(true)) => {
                let mut book = self.book();
                if let Some(state) = book.sessions.get_mut(&session.id) {
                    state.refreshed = state.refreshed.max(sent);
                }
                Ok(Some(sent))
            }
            Ok(Ok(false)) => {
                *stream = None;
                self.gone(session.id);
                Ok(None)
            }
            Ok(Err(e)) => {
                *stream = None;
                Err(error::map(e))
            }
            Err(_) => {
                *stream = None;
                Err(LockError::unavailable(
                    BACKEND,
                    format!("lease keep-alive got no answer within {:?}", self.timeout),
                ))
            }
        }
    }

    /// Reserves the lowest free entry number of `session` in `queue`.
    pub(crate) fn reserve(&self, session: i64, queue: &[u8]) -> u32 {
        let mut book = self.book();
        let Some(state) = book.sessions.get_mut(&session) else {
            return 0; // a session just gone: the put fails on its lease
        };
        let used = state.numbers.entry(queue.to_vec()).or_default();
        let n = (0..).find(|n| !used.contains(n)).unwrap_or(u32::MAX);
        used.insert(n);
        n
    }

    /// Frees an entry number whose key is known not to exist.
    pub(crate) fn unreserve(&self, session: i64, queue: &[u8], n: u32) {
        free_number(&mut self.book(), session, queue, n);
    }

    /// A write on `session` got no answer: never refresh it again.
    pub(crate) fn retire(&self, session: i64) {
        let mut book = self.book();
        if let Some(state) = book.sessions.get_mut(&session)
            && state.status == Status::Live
        {
            tracing::debug!(
                session,
                "etcd session retired after a write without an answer"
            );
            state.status = Status::Retired;
        }
    }

    /// etcd says `session` is gone: every key on it went with it.
    pub(crate) fn gone(&self, session: i64) {
        let mut book = self.book();
        if let Some(state) = book.sessions.get_mut(&session) {
            state.status = Status::Dead;
        }
        let keys: Vec<Vec<u8>> = book
            .entries
            .iter()
            .filter(|(_, e)| e.session == session)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(entry) = remove(&mut book, &key) {
                entry.lost.cancel();
            }
        }
    }

    /// Records a key this client attached to `session`.
    pub(crate) fn record(&self, key: Vec<u8>, entry: Entry) {
        let mut book = self.book();
        if let Some(old) = book.entries.insert(key, entry) {
            old.lost.cancel();
        }
    }

    /// The book's entry of `key` if it is the grant created at `revision`.
    pub(crate) fn entry(&self, key: &[u8], revision: i64) -> Option<Entry> {
        self.book()
            .entries
            .get(key)
            .filter(|e| e.revision == revision)
            .cloned()
    }

    /// A waiting entry became the holder: it is paid up to its session's
    /// last refresh + TTL, which the grant's lease counts from.
    pub(crate) fn granted(
        &self,
        key: &[u8],
        revision: i64,
    ) -> Option<(Instant, CancellationToken)> {
        let mut book = self.book();
        let session = book
            .entries
            .get(key)
            .filter(|e| e.revision == revision)?
            .session;
        let state = book.sessions.get(&session)?;
        let (refreshed, ttl) = (state.refreshed, state.handle.ttl);
        let entry = book.entries.get_mut(key)?;
        entry.kind = Kind::Held {
            paid_until: refreshed + ttl,
        };
        Some((refreshed, entry.lost.clone()))
    }

    /// The entry created at `revision` now holds `value`.
    pub(crate) fn rewritten(&self, key: &[u8], revision: i64, value: Arc<[u8]>) {
        let mut book = self.book();
        if let Some(entry) = book.entries.get_mut(key).filter(|e| e.revision == revision) {
            entry.value = value;
        }
    }

    /// A renewal of the grant created at `revision` was answered for a
    /// keep-alive sent at `sent`; `false` if the book no longer holds it.
    pub(crate) fn renewed(&self, key: &[u8], revision: i64, session: i64, sent: Instant) -> bool {
        let mut book = self.book();
        let Some(ttl) = book.sessions.get(&session).map(|s| s.handle.ttl) else {
            return false;
        };
        match book.entries.get_mut(key) {
            Some(entry)
                if entry.revision == revision && matches!(entry.kind, Kind::Held { .. }) =>
            {
                entry.session = session;
                entry.kind = Kind::Held {
                    paid_until: sent + ttl,
                };
                true
            }
            _ => false,
        }
    }

    /// The key of the grant created at `revision` is gone (released,
    /// evicted, found missing): forget it. Returns what the book had.
    pub(crate) fn forget(&self, key: &[u8], revision: i64) -> Option<Entry> {
        let mut book = self.book();
        if book
            .entries
            .get(key)
            .is_some_and(|e| e.revision == revision)
        {
            remove(&mut book, key)
        } else {
            None
        }
    }

    /// A cancelled wait whose cleanup failed: the keeper deletes the entry
    /// once its session's last refresh runs out.
    pub(crate) fn doom(&self, key: &[u8], revision: i64) {
        let mut book = self.book();
        let Some(session) = book
            .entries
            .get(key)
            .filter(|e| e.revision == revision)
            .map(|e| e.session)
        else {
            return;
        };
        let paid_until = book
            .sessions
            .get(&session)
            .map_or_else(Instant::now, |s| s.refreshed + s.handle.ttl);
        if let Some(entry) = book.entries.get_mut(key) {
            entry.kind = Kind::Doomed { paid_until };
        }
    }

    /// The status and TTL of `session`.
    pub(crate) fn status(&self, session: i64) -> Option<(Status, Duration)> {
        let book = self.book();
        book.sessions
            .get(&session)
            .map(|s| (s.status, s.handle.ttl))
    }

    /// The session handle of `id`.
    pub(crate) fn handle(&self, id: i64) -> Option<Arc<Session>> {
        self.book().sessions.get(&id).map(|s| s.handle.clone())
    }

    /// Live sessions (for tests and metrics).
    pub(crate) fn live(&self) -> usize {
        self.book()
            .sessions
            .values()
            .filter(|s| s.status == Status::Live)
            .count()
    }

    /// Moves `keys` (with their create revisions and values) onto `target`,
    /// keeping each key's create revision; returns the keys moved (the
    /// others are gone).
    pub(crate) async fn move_to(
        &self,
        target: i64,
        keys: &[Attached],
    ) -> Result<Vec<Vec<u8>>, LockError> {
        let mut moved = Vec::new();
        for batch in keys.chunks(MOVE_BATCH) {
            let ops: Vec<TxnOp> = batch
                .iter()
                .map(
                    |Attached {
                         key,
                         revision,
                         value,
                     }| {
                        TxnOp::txn(
                            Txn::new()
                                .when([Compare::create_revision(
                                    key.clone(),
                                    CompareOp::Equal,
                                    *revision,
                                )])
                                .and_then([TxnOp::put(
                                    key.clone(),
                                    value.to_vec(),
                                    Some(PutOptions::new().with_lease(target)),
                                )]),
                        )
                    },
                )
                .collect();
            let reply = timed(
                self.timeout,
                "move to a new session",
                self.client.kv_client().txn(Txn::new().and_then(ops)),
            )
            .await?;
            for (Attached { key, .. }, op) in batch.iter().zip(reply.op_responses()) {
                if let etcd_client::TxnOpResponse::Txn(nested) = op
                    && nested.succeeded()
                {
                    moved.push(key.clone());
                }
            }
        }
        Ok(moved)
    }

    fn spawn_revoke(&self, id: i64) {
        let mut leases = self.client.lease_client();
        let limit = self.timeout;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
            });
        }
    }

    fn start_keeper(self: &Arc<Self>) {
        let mut running = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        if *running {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *running = true;
            runtime.spawn(keep(Arc::downgrade(self)));
        }
    }
}

fn free_number(book: &mut Book, session: i64, queue: &[u8], n: u32) {
    if let Some(used) = book
        .sessions
        .get_mut(&session)
        .and_then(|s| s.numbers.get_mut(queue))
    {
        used.remove(&n);
        if used.is_empty() {
            book.sessions
                .get_mut(&session)
                .map(|s| s.numbers.remove(queue));
        }
    }
}

fn remove(book: &mut Book, key: &[u8]) -> Option<Entry> {
    let entry = book.entries.remove(key)?;
    if let Some((queue, n)) = &entry.number {
        free_number(book, entry.session, queue, *n);
    }
    Some(entry)
}

/// What the keeper does in one tick, decided under the book's lock.
#[derive(Default)]
struct Chores {
    refresh: Vec<Arc<Session>>,
    /// Retired sessions' waiting entries to move: (from, keys).
    moves: Vec<(i64, Vec<Attached>)>,
    /// Keys whose time ran out: (key, create revision, session).
    overdue: Vec<(Vec<u8>, i64, i64)>,
    revoke: Vec<i64>,
}

/// The keeper: refreshes sessions with waiting entries, deletes keys whose
/// time ran out, moves waiting entries off retired sessions, and drops
/// sessions nobody uses. Exits when the client is dropped.
async fn keep(sessions: Weak<Sessions>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        {
            // Nothing to keep: stop (the next session starts a keeper again;
            // checked under the flag `start_keeper` takes after inserting).
            let mut running = sessions.keeper.lock().unwrap_or_else(|p| p.into_inner());
            if sessions.book().sessions.is_empty() {
                *running = false;
                return;
            }
        }
        let chores = sessions.plan(Instant::now());
        for session in chores.refresh {
            let sessions = sessions.clone();
            tokio::spawn(async move {
                if let Err(e) = sessions.refresh(&session).await {
                    tracing::debug!(error = %e, "refreshing an etcd session failed; retrying");
                }
                sessions.done_with(session.id);
            });
        }
        for (from, keys) in chores.moves {
            tokio::spawn(sessions.clone().move_waiting(from, keys));
        }
        for (key, revision, session) in chores.overdue {
            tokio::spawn(sessions.clone().delete_overdue(key, revision, session));
        }
        for id in chores.revoke {
            sessions.spawn_revoke(id);
        }
    }
}

impl Sessions {
    fn plan(&self, now: Instant) -> Chores {
        let mut chores = Chores::default();
        let mut book = self.book();
        // Per session: how many entries, and whether some wait.
        let mut used: HashMap<i64, (usize, bool)> = HashMap::new();
        let mut overdue = Vec::new();
        for (key, entry) in &book.entries {
            let counts = used.entry(entry.session).or_default();
            counts.0 += 1;
            match entry.kind {
                Kind::Waiting => counts.1 = true,
                Kind::Held { paid_until } | Kind::Doomed { paid_until } if paid_until <= now => {
                    overdue.push(key.clone());
                }
                _ => {}
            }
        }
        for key in overdue {
            // Its holder's deadline has passed: it is lost, and deleted now
            // (retried a second later if etcd does not confirm).
            if let Some(entry) = book.entries.get_mut(&key) {
                entry.lost.cancel();
                entry.kind = Kind::Doomed {
                    paid_until: now + TICK * 10,
                };
                chores.overdue.push((key, entry.revision, entry.session));
            }
        }
        let Book {
            current,
            sessions,
            entries,
        } = &mut *book;
        sessions.retain(|id, state| {
            let (count, waiting) = used.get(id).copied().unwrap_or_default();
            let count = count + state.users;
            state.empty_since = match (count, state.empty_since) {
                (0, None) => Some(now),
                (0, since) => since,
                _ => None,
            };
            // An unused session is kept a while for the next lock, as long
            // as its lease may still be alive.
            let idle = state.empty_since.is_some_and(|since| now - since >= IDLE)
                || state.refreshed.elapsed() > state.handle.ttl;
            let is_current = current.get(&state.handle.ttl) == Some(id);
            let keep = count > 0 || (state.status == Status::Live && is_current && !idle);
            if !keep {
                state.handle.ended.cancel();
                if state.status != Status::Dead {
                    chores.revoke.push(*id);
                }
                return false;
            }
            match state.status {
                Status::Live
                    if waiting && !state.busy && now >= state.refreshed + state.handle.ttl / 3 =>
                {
                    state.busy = true;
                    chores.refresh.push(state.handle.clone());
                }
                Status::Retired if waiting && !state.busy => {
                    state.busy = true;
                    let keys = entries
                        .iter()
                        .filter(|(_, e)| e.session == *id && matches!(e.kind, Kind::Waiting))
                        .map(|(k, e)| Attached {
                            key: k.clone(),
                            revision: e.revision,
                            value: e.value.clone(),
                        })
                        .collect();
                    chores.moves.push((*id, keys));
                }
                _ => {}
            }
            true
        });
        current.retain(|_, id| sessions.contains_key(id));
        chores
    }

    /// Moves a retired session's waiting entries to the current session of
    /// its TTL.
    async fn move_waiting(self: Arc<Self>, from: i64, keys: Vec<Attached>) {
        let outcome = async {
            let ttl = self
                .status(from)
                .map(|(_, ttl)| ttl)
                .ok_or_else(|| LockError::unavailable(BACKEND, "session gone"))?;
            let target = self.for_entry(ttl).await?;
            let moved = self.move_to(target.session.id, &keys).await?;
            let mut book = self.book();
            for key in &moved {
                if let Some(entry) = book.entries.get_mut(key) {
                    entry.session = target.session.id;
                    if let Some((queue, n)) = entry.number.take() {
                        free_number(&mut book, from, &queue, n);
                        // Named after the old session: the number stays out
                        // of use there, and nothing on the new one uses it.
                    }
                }
            }
            Ok::<_, LockError>(())
        }
        .await;
        if let Err(e) = outcome {
            tracing::debug!(error = %e, "moving waiting entries off a retired etcd session failed; retrying");
        }
        self.done_with(from);
    }

    fn done_with(&self, session: i64) {
        if let Some(state) = self.book().sessions.get_mut(&session) {
            state.busy = false;
        }
    }

    /// Deletes a key whose time ran out (if it is still that grant); if etcd
    /// cannot be told, its session is retired so no refresh extends it.
    async fn delete_overdue(self: Arc<Self>, key: Vec<u8>, revision: i64, session: i64) {
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.clone(), None)]);
        match timed(
            self.timeout,
            "delete an expired entry",
            self.client.kv_client().txn(txn),
        )
        .await
        {
            Ok(_) => {
                self.forget(&key, revision);
            }
            Err(e) => {
                tracing::debug!(error = %e, "deleting an expired entry failed; its session is retired");
                self.retire(session);
            }
        }
    }
}
