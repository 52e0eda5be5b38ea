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
//!
//! A raise of the fence floor (the step that follows a restore from a
//! backup) retires every session granted before the client knew of it: the
//! restore brings a session back as the backup had it, with keys only the
//! backup remembers (a lock released since, a wait given up since), which
//! refreshing it would keep blocking their names for ever. Retired, it goes
//! the way of every retired session, and is revoked, keys and all, once
//! none of the client's own keys is left on it. Since restored revisions
//! repeat, a key is moved or deleted only if both its create revision and
//! its value (owner token, offset, label: one grant's) are the book's; and
//! moved only off the session it is on.
//!
//! A grant whose remaining time is set (`set_remaining`, see
//! `locks::remaining`) leaves its session for a lease of its own: from
//! then on etcd alone expires it, and the book forgets it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use lockcore::backend::{CancellationToken, Clock, Moment};
use tokio::time::Instant;

use crate::connection::{Conn, MAX_TXN_OPS};
use crate::fence::floor::Floor;
use crate::keys::Keys;

mod keeper;
mod lease;

/// How often the keeper looks at the book.
const TICK: Duration = Duration::from_millis(100);
/// How long a session nothing is attached to is kept for the next lock.
const IDLE: Duration = Duration::from_secs(5);
/// Entries moved off a retired session per transaction: each is a nested
/// transaction of three compares, which etcd counts against what the
/// parent's branch of one operation per entry leaves.
const MOVE_BATCH: usize = MAX_TXN_OPS - 3;

/// How far a session may be from its last refresh and still take a new
/// entry without one: a new grant then gets at least 3/4 of its TTL.
pub(crate) fn fresh_enough(ttl: Duration) -> Duration {
    ttl / 4
}

/// A session a new key is being written to: the keeper keeps it (and does
/// not revoke it) until this is dropped.
pub(crate) struct Use {
    pub(crate) session: Arc<Session>,
    /// When the last request that proved its lease alive was sent (a new
    /// entry's lease counts from then).
    pub(crate) refreshed: Moment,
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
    /// A grant: alive until it is no longer paid for, unless renewed.
    Held { paid: Paid },
    /// To be deleted (a cancelled wait whose cleanup failed): alive as long
    /// as it is paid for at most.
    Doomed { paid: Paid },
    /// A grant `set_remaining` is moving onto a lease of its own: neither
    /// deleted nor renewed nor forgotten here until the move's outcome is
    /// known (its session is kept meanwhile); held as `paid` again if the
    /// move failed.
    Leaving { paid: Paid },
}

/// What the book says of a grant `set_remaining` is about to move off its
/// session ([`Sessions::leave`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// Held by this client: marked leaving.
    Marked,
    /// Not in the book (a grant of another client, or one already on a
    /// lease of its own): etcd alone decides.
    Unbooked,
    /// No longer held here: its time ran out (the keeper deletes it).
    Over,
}

/// How long a key is paid for: a TTL from a proof that its session was
/// alive, read (both clocks) before the request that proved it was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paid {
    pub(crate) from: Moment,
    pub(crate) ttl: Duration,
}

impl Paid {
    /// Whether, as of `now`, the time paid for has run out (a host suspend
    /// counts: see [`Moment::since`]).
    pub(crate) fn over(&self, now: Moment) -> bool {
        now.since(self.from) >= self.ttl
    }
}

/// Whether clock reading `a` was taken no earlier than `b` (both on the
/// same clock, whose monotonic part orders them).
pub(crate) fn not_before(a: Moment, b: Moment) -> bool {
    a.mono() >= b.mono()
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
    /// The latest proof that its lease is alive (see [`Use::refreshed`]).
    refreshed: Moment,
    /// The fence offset this client knew when it granted the lease.
    epoch: u64,
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
    conn: Arc<Conn>,
    keys: Keys,
    timeout: Duration,
    /// What every proof of life is read on (the system clocks, or a test's).
    pub(crate) clock: Arc<dyn Clock>,
    /// The fence offset as this client knows it: a session granted under a
    /// lower one may be a restored backup's, and is retired (see `keeper`).
    floor: Arc<Floor>,
    on_session: OnSession,
    book: Mutex<Book>,
    /// Serializes session grants, so concurrent first uses share one.
    granting: tokio::sync::Mutex<()>,
    keeper: Mutex<bool>,
    /// Set at close: nothing new enters the book.
    closed: std::sync::atomic::AtomicBool,
}

impl Sessions {
    pub(crate) fn new(
        conn: Arc<Conn>,
        keys: Keys,
        timeout: Duration,
        clock: Arc<dyn Clock>,
        floor: Arc<Floor>,
        on_session: OnSession,
    ) -> Self {
        Sessions {
            conn,
            keys,
            timeout,
            clock,
            floor,
            on_session,
            book: Mutex::default(),
            granting: tokio::sync::Mutex::new(()),
            keeper: Mutex::new(false),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Records a key this client attached to `session` (once closed, the
    /// grant is lost at once: its session is revoked).
    pub(crate) fn record(&self, key: Vec<u8>, entry: Entry) {
        let mut book = self.book();
        if self.is_closed() {
            entry.lost.cancel();
            return;
        }
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

    /// A waiting entry became the holder: it is paid for a TTL from its
    /// session's last proof of life, which the grant's lease counts from.
    pub(crate) fn granted(&self, key: &[u8], revision: i64) -> Option<(Moment, CancellationToken)> {
        let mut book = self.book();
        if self.is_closed() {
            return None;
        }
        let session = book
            .entries
            .get(key)
            .filter(|e| e.revision == revision)?
            .session;
        let state = book.sessions.get(&session)?;
        let (refreshed, ttl) = (state.refreshed, state.handle.ttl);
        let entry = book.entries.get_mut(key)?;
        entry.kind = Kind::Held {
            paid: Paid {
                from: refreshed,
                ttl,
            },
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
    pub(crate) fn renewed(&self, key: &[u8], revision: i64, session: i64, sent: Moment) -> bool {
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
                    paid: Paid { from: sent, ttl },
                };
                true
            }
            _ => false,
        }
    }

    /// The key of the grant created at `revision` is gone (released,
    /// evicted, found missing): forget it. Returns what the book had. A
    /// grant on its way to a lease of its own is left to its move (a
    /// renewal that raced it did not find it on its session).
    pub(crate) fn forget(&self, key: &[u8], revision: i64) -> Option<Entry> {
        let mut book = self.book();
        if book
            .entries
            .get(key)
            .is_some_and(|e| e.revision == revision && !matches!(e.kind, Kind::Leaving { .. }))
        {
            remove(&mut book, key)
        } else {
            None
        }
    }

    /// `set_remaining` is about to move the grant created at `revision`
    /// onto a lease of its own: while it does, the keeper must not delete
    /// the key when its time here runs out, nor may a renewal keep it. A
    /// grant whose time ran out is not held, even before the keeper's next
    /// look deletes it.
    pub(crate) fn leave(&self, key: &[u8], revision: i64) -> Leaving {
        let now = self.clock.now();
        let mut book = self.book();
        let Some(entry) = book.entries.get_mut(key).filter(|e| e.revision == revision) else {
            return Leaving::Unbooked;
        };
        match entry.kind {
            Kind::Held { paid } if !paid.over(now) => {
                entry.kind = Kind::Leaving { paid };
                Leaving::Marked
            }
            _ => Leaving::Over,
        }
    }

    /// The move [`leave`](Self::leave) announced failed (or may have): the
    /// grant is held here again, paid as before, so it expires on its own
    /// TTL.
    pub(crate) fn stay(&self, key: &[u8], revision: i64) {
        let mut book = self.book();
        if let Some(entry) = book.entries.get_mut(key).filter(|e| e.revision == revision)
            && let Kind::Leaving { paid } = entry.kind
        {
            entry.kind = Kind::Held { paid };
        }
    }

    /// The move [`leave`](Self::leave) announced is over (the key is on a
    /// lease of its own, or gone): the book lets go of it. Returns what the
    /// book had.
    pub(crate) fn left(&self, key: &[u8], revision: i64) -> Option<Entry> {
        let mut book = self.book();
        if book
            .entries
            .get(key)
            .is_some_and(|e| e.revision == revision && matches!(e.kind, Kind::Leaving { .. }))
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
        let paid = book.sessions.get(&session).map_or_else(
            || Paid {
                from: self.clock.now(),
                ttl: Duration::ZERO,
            },
            |s| Paid {
                from: s.refreshed,
                ttl: s.handle.ttl,
            },
        );
        if let Some(entry) = book.entries.get_mut(key) {
            entry.kind = Kind::Doomed { paid };
        }
    }

    /// Closing: every key of the book is forgotten and every grant's loss
    /// signal fires; every session leaves the book (no new one is granted:
    /// the conn is shut down first), its notices stop. Returns the sessions
    /// etcd may still have, to revoke.
    pub(crate) fn close(&self) -> Vec<Arc<Session>> {
        let mut book = self.book();
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        for entry in book.entries.values() {
            entry.lost.cancel();
        }
        book.entries.clear();
        book.current.clear();
        book.sessions
            .drain()
            .map(|(_, state)| {
                state.handle.ended.cancel();
                (state.status, state.handle)
            })
            .filter(|(status, _)| *status != Status::Dead)
            .map(|(_, handle)| handle)
            .collect()
    }

    /// Whether the client was closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
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
