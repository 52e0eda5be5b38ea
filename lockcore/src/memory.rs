//! `MemoryBackend`: the reference implementation of [`LockBackend`].
//!
//! It keeps locks and semaphores in process memory, judges expiry on the
//! tokio clock (which plays the store's clock, and can be paused in tests),
//! draws fencing tokens from one counter that never goes back, and wakes
//! waiters through a change channel per name. It passes the whole
//! conformance suite and is the default backend for demos, tests and
//! single-process programs.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::wait::{self, WaitPolicy, Wakeup};
use crate::backend::{Kind, LockRequest, Moment, Polling, Ttl};
use crate::request::Access;
use crate::{
    Attempt, AttemptEach, Capabilities, ExpiryClock, FenceDurability, FencingToken, Holder,
    HolderLabel, Lease, LockBackend, LockError, LockName, OwnerToken, ReleaseOutcome,
};

const BACKEND: &str = "memory";

/// Locks (and semaphores) in this process's memory. Clones share the same
/// locks, so each clone plays an independent client of one store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lockcore::{Locker, MemoryBackend};
///
/// let store = MemoryBackend::new();
/// let (a, b) = (Locker::new(store.clone()), Locker::new(store));
/// let guard = a.acquire("report").await?;
/// assert!(b.try_acquire("report").await?.is_none());
/// guard.release().await?;
/// assert!(b.try_acquire("report").await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    client: Client,
}

/// What is this client's own: whether it was closed, and the owners of the
/// grants it handed out (to fire their loss at close).
#[derive(Default)]
struct Client {
    closed: AtomicBool,
    owners: Mutex<HashSet<OwnerToken>>,
}

impl Clone for MemoryBackend {
    /// Another client of the same store.
    fn clone(&self) -> Self {
        MemoryBackend {
            state: self.state.clone(),
            client: Client::default(),
        }
    }
}

/// Locks, semaphores and reader-writer locks live in separate namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Lock(LockName),
    Semaphore(LockName),
    ReadWrite(LockName),
}

impl Key {
    fn new(name: &LockName, kind: Kind) -> Key {
        match kind {
            Kind::Lock => Key::Lock(name.clone()),
            Kind::Semaphore => Key::Semaphore(name.clone()),
            Kind::ReadWrite => Key::ReadWrite(name.clone()),
        }
    }

    fn of(lease: &Lease) -> Key {
        Key::new(lease.name(), lease.kind())
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    /// One counter for every name and slot: strictly increasing per name and
    /// per slot, and nothing to remember once a name is free.
    last_fence: u64,
}

/// A lock (one seat), a semaphore (one seat per permit) or a
/// reader-writer lock (one seat per holder).
struct Entry {
    seats: Vec<Option<Grant>>,
    changes: watch::Sender<()>,
    /// Writers waiting for a reader-writer lock: no reader is granted
    /// while there is one.
    writers_waiting: usize,
}

#[derive(Clone)]
struct Grant {
    owner: OwnerToken,
    fence: FencingToken,
    expires_at: Instant,
    label: HolderLabel,
    access: Option<Access>,
    /// Cancelled on eviction: the holder's guard hears it at once.
    evicted: CancellationToken,
}

impl Grant {
    fn holder(&self, now: Instant) -> Holder {
        let holder = Holder::new(self.fence, Some(self.owner), Some(self.expires_at - now))
            .with_label(Some(self.label.clone()));
        match self.access {
            Some(access) => holder.with_access(access),
            None => holder,
        }
    }

    fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }
}

impl Entry {
    fn live(&self, seat: usize, now: Instant) -> Option<&Grant> {
        self.seats.get(seat)?.as_ref().filter(|g| g.is_live(now))
    }

    fn live_count(&self, now: Instant) -> usize {
        (0..self.seats.len())
            .filter(|&i| self.live(i, now).is_some())
            .count()
    }

    fn holds(&self, lease: &Lease, now: Instant) -> bool {
        self.live(self.seat_of(lease), now)
            .is_some_and(|g| g.owner == lease.owner() && g.fence == lease.fence())
    }

    /// The seat `lease` holds: its slot, or for a reader-writer share the
    /// seat of its owner (past the end when it has none).
    fn seat_of(&self, lease: &Lease) -> usize {
        match lease.access() {
            None => lease.slot().unwrap_or(0) as usize,
            Some(_) => self
                .seats
                .iter()
                .position(|g| g.as_ref().is_some_and(|g| g.owner == lease.owner()))
                .unwrap_or(self.seats.len()),
        }
    }

    /// Whether a reader-writer `access` can be granted now: a read while no
    /// writer holds or waits, a write while nobody holds.
    fn admits(&self, access: Access, now: Instant) -> bool {
        let mut live = (0..self.seats.len()).filter_map(|i| self.live(i, now));
        match access {
            Access::Read => {
                self.writers_waiting == 0 && live.all(|g| g.access == Some(Access::Read))
            }
            Access::Write => live.next().is_none(),
        }
    }

    /// A free seat for a reader-writer share, added when all are taken.
    fn free_seat(&mut self, now: Instant) -> usize {
        match (0..self.seats.len()).find(|&i| self.live(i, now).is_none()) {
            Some(seat) => seat,
            None => {
                self.seats.push(None);
                self.seats.len() - 1
            }
        }
    }

    fn free(&mut self, seat: usize) {
        if let Some(s) = self.seats.get_mut(seat) {
            *s = None;
        }
        self.changes.send_replace(());
    }

    /// The earliest expiry among live grants.
    fn next_expiry(&self, now: Instant) -> Option<Instant> {
        (0..self.seats.len())
            .filter_map(|i| self.live(i, now).map(|g| g.expires_at))
            .min()
    }
}

impl State {
    fn entry(&mut self, key: Key, seats: usize) -> &mut Entry {
        self.entries.entry(key).or_insert_with(|| Entry {
            seats: vec![None; seats],
            changes: watch::channel(()).0,
            writers_waiting: 0,
        })
    }

    /// Grants `seat` of `key` to `request`, sent at `sent`.
    fn grant(
        &mut self,
        key: Key,
        seat: usize,
        request: &LockRequest,
        sent: Moment,
        now: Instant,
    ) -> Lease {
        self.last_fence += 1;
        let fence = FencingToken::new(self.last_fence).expect("counter starts above zero");
        let owner = OwnerToken::new();
        let evicted = CancellationToken::new();
        let ttl = request.ttl();
        self.entries
            .get_mut(&key)
            .expect("the entry was just looked at")
            .seats[seat] = Some(Grant {
            owner,
            fence,
            expires_at: now + ttl.get(),
            label: request.label().clone(),
            access: request.access(),
            evicted: evicted.clone(),
        });
        Lease::granted(request, owner, fence, sent).with_loss_signal(evicted)
    }

    /// Forgets entries with nothing live and nobody waiting, so memory stays
    /// bounded by the number of held or watched names.
    fn tidy(&mut self, key: &Key, now: Instant) {
        if let Some(entry) = self.entries.get(key)
            && entry.live_count(now) == 0
            && entry.writers_waiting == 0
            && entry.changes.receiver_count() == 0
        {
            self.entries.remove(key);
        }
    }

    /// A wake-up for a change of `key`, or the expiry of its earliest holder.
    fn watch(&mut self, key: Key, seats: usize, now: Instant) -> Wakeup {
        let entry = self.entry(key, seats);
        let mut changes = entry.changes.subscribe();
        let expiry = entry.next_expiry(now);
        Box::pin(async move {
            let expired = async {
                match expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changes.changed() => {}
                _ = expired => {}
            }
        })
    }
}

impl MemoryBackend {
    /// One of `permits` slots of the semaphore `request.name()`.
    fn try_acquire_permit(
        &self,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        crate::support::check_permits(request.name(), permits)?;
        let sent = request.now();
        let now = Instant::now();
        let key = Key::Semaphore(request.name().clone());
        let mut state = self.open()?;
        let entry = state.entry(key.clone(), permits as usize);
        if entry.seats.len() != permits as usize {
            if entry.live_count(now) > 0 {
                return Err(LockError::PermitsMismatch {
                    name: request.name().clone(),
                    requested: permits,
                    existing: entry.seats.len() as u32,
                });
            }
            // Nobody holds a permit: the semaphore starts over with the new count.
            entry.seats = vec![None; permits as usize];
        }
        let free = (0..entry.seats.len()).find(|&i| entry.live(i, now).is_none());
        match free {
            Some(seat) => {
                let lease = state.grant(key, seat, request, sent, now);
                Ok(Attempt::Acquired(
                    self.granted(lease.with_slot(seat as u32)),
                ))
            }
            None => Ok(Attempt::Held {
                expires_in: entry.next_expiry(now).map(|at| at - now),
            }),
        }
    }

    /// A share of the reader-writer lock `request.name()`.
    fn try_acquire_share(
        &self,
        request: &LockRequest,
        access: Access,
    ) -> Result<Attempt, LockError> {
        let sent = request.now();
        let now = Instant::now();
        let key = Key::ReadWrite(request.name().clone());
        let mut state = self.open()?;
        let entry = state.entry(key.clone(), 0);
        if !entry.admits(access, now) {
            return Ok(Attempt::Held {
                expires_in: entry.next_expiry(now).map(|at| at - now),
            });
        }
        let seat = entry.free_seat(now);
        let lease = state.grant(key, seat, request, sent, now);
        Ok(Attempt::Acquired(self.granted(lease)))
    }

    /// Marks a writer waiting for the reader-writer lock `name` until the
    /// returned intent is dropped.
    pub(crate) fn writer_waits(&self, name: &LockName) -> Result<WriterIntent<'_>, LockError> {
        let key = Key::ReadWrite(name.clone());
        self.open()?.entry(key.clone(), 0).writers_waiting += 1;
        Ok(WriterIntent { store: self, key })
    }

    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The store, once this client is known to be open.
    fn open(&self) -> Result<MutexGuard<'_, State>, LockError> {
        if self.client.closed.load(Ordering::Acquire) {
            return Err(LockError::unavailable(BACKEND, "this client was closed"));
        }
        Ok(self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave State half-updated
        // (every update is a single assignment), so poisoning is ignored.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn owners(&self) -> MutexGuard<'_, HashSet<OwnerToken>> {
        self.client
            .owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers a grant of this client, to fire its loss at close.
    fn granted(&self, lease: Lease) -> Lease {
        self.owners().insert(lease.owner());
        lease
    }
}

/// A writer waiting: while it lives, no reader is granted the name.
pub(crate) struct WriterIntent<'a> {
    store: &'a MemoryBackend,
    key: Key,
}

impl Drop for WriterIntent<'_> {
    fn drop(&mut self) {
        let mut state = self.store.lock();
        if let Some(entry) = state.entries.get_mut(&self.key) {
            entry.writers_waiting = entry.writers_waiting.saturating_sub(1);
            entry.changes.send_replace(());
        }
        state.tidy(&self.key, Instant::now());
    }
}

#[cfg(feature = "testing")]
impl MemoryBackend {
    /// Frees the lock `name` now as if its TTL had run out: waiters are
    /// woken, the holder is not told (its next renewal is refused). The
    /// expired holder, if any. For [`testing::TestStore::expire`](crate::testing::TestStore::expire).
    pub(crate) fn expire_now(&self, name: &LockName) -> Option<Holder> {
        let now = Instant::now();
        let key = Key::Lock(name.clone());
        let mut state = self.lock();
        let entry = state.entries.get_mut(&key)?;
        let expired = entry.live(0, now).map(|g| g.holder(now));
        if expired.is_some() {
            entry.free(0);
        }
        state.tidy(&key, now);
        expired
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryBackend")
            .field("names", &state.entries.len())
            .field("last_fence", &state.last_fence)
            .finish()
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .fence_durability(FenceDurability::Volatile)
            .notifications(true)
            .expiry_clock(ExpiryClock::ProcessClock)
            .eviction_notice(Some(Duration::ZERO))
            .semaphores(true)
            .rw_locks(true)
            .atomic_multi(true)
            .fence_floor(true)
            .sets_remaining(true)
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        if let Some(access) = request.access() {
            return self.try_acquire_share(request, access);
        }
        if let Some(permits) = request.permits() {
            return self.try_acquire_permit(request, permits);
        }
        let sent = request.now();
        let now = Instant::now();
        let key = Key::Lock(request.name().clone());
        let mut state = self.open()?;
        if let Some(holder) = state.entry(key.clone(), 1).live(0, now) {
            return Ok(Attempt::Held {
                expires_in: Some(holder.expires_at - now),
            });
        }
        let lease = state.grant(key, 0, request, sent, now);
        Ok(Attempt::Acquired(self.granted(lease)))
    }

    /// Every lock or none, under one lock of the store.
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        let sent: Vec<Moment> = requests.iter().map(LockRequest::now).collect();
        let now = Instant::now();
        let mut state = self.open()?;
        for request in requests {
            let key = Key::Lock(request.name().clone());
            if let Some(holder) = state.entries.get(&key).and_then(|e| e.live(0, now)) {
                return Ok(AttemptEach::Held {
                    name: request.name().clone(),
                    expires_in: Some(holder.expires_at - now),
                });
            }
        }
        Ok(AttemptEach::Acquired(
            requests
                .iter()
                .zip(sent)
                .map(|(request, sent)| {
                    let key = Key::Lock(request.name().clone());
                    state.entry(key.clone(), 1);
                    self.granted(state.grant(key, 0, request, sent, now))
                })
                .collect(),
        ))
    }

    /// One batch under one lock of the store, as a store renews a batch in
    /// one atomic operation.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let now = Instant::now();
        let mut state = match self.open() {
            Ok(state) => state,
            Err(e) => return leases.iter().map(|_| Err(e.clone())).collect(),
        };
        leases
            .iter()
            .map(|lease| {
                let sent = lease.now();
                match state.entries.get_mut(&Key::of(lease)) {
                    Some(entry) if entry.holds(lease, now) => {
                        let seat = entry.seat_of(lease);
                        if let Some(Some(grant)) = entry.seats.get_mut(seat) {
                            grant.expires_at = now + lease.ttl().get();
                        }
                        Ok(lease.renewed(sent))
                    }
                    _ => Err(LockError::NotHeld {
                        name: lease.name().clone(),
                    }),
                }
            })
            .collect()
    }

    /// A renewal by `remaining` instead of the lease's TTL: the expiry
    /// becomes exactly now + `remaining` on the store's clock, owner- and
    /// fence-checked under the store's one lock.
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        self.renew(&lease.clone().with_ttl(remaining)).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let now = Instant::now();
        let key = Key::of(lease);
        let mut state = self.open()?;
        self.owners().remove(&lease.owner());
        let outcome = match state.entries.get_mut(&key) {
            Some(entry) if entry.holds(lease, now) => {
                entry.free(entry.seat_of(lease));
                ReleaseOutcome::Released
            }
            _ => ReleaseOutcome::NotHeld,
        };
        state.tidy(&key, now);
        Ok(outcome)
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        let now = Instant::now();
        let state = self.open()?;
        let key = Key::new(name, kind);
        let Some(entry) = state.entries.get(&key) else {
            return Ok(Vec::new());
        };
        Ok((0..entry.seats.len())
            .filter_map(|i| {
                let holder = entry.live(i, now)?.holder(now);
                Some(match key {
                    Key::Lock(_) | Key::ReadWrite(_) => holder,
                    Key::Semaphore(_) => holder.with_slot(i as u32),
                })
            })
            .collect())
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let now = Instant::now();
        let key = Key::Lock(name.clone());
        let mut state = self.open()?;
        let entry = state.entry(key.clone(), 1);
        let evicted = entry
            .live(0, now)
            .filter(|g| expected.is_none_or(|fence| g.fence == fence))
            .cloned();
        if let Some(grant) = &evicted {
            grant.evicted.cancel();
            entry.free(0);
        }
        state.tidy(&key, now);
        // The next grant draws from the shared counter: larger than the
        // evicted fence already.
        Ok(evicted.map(|g| g.holder(now)))
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        let now = Instant::now();
        let key = Key::new(name, kind);
        Ok(Some(self.open()?.watch(key, 1, now)))
    }

    /// The one wait loop; a writer waiting for a reader-writer lock marks
    /// itself waiting for as long as the loop runs.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let _intent = match request.access() {
            Some(Access::Write) => Some(self.writer_waits(request.name())?),
            _ => None,
        };
        wait::wait(wait, &mut Polling::new(self, request)).await
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.capabilities().check_fence_floor(floor)?;
        let mut state = self.open()?;
        state.last_fence = state.last_fence.max(floor.get());
        Ok(())
    }

    /// Fires the loss of every grant of this client still in the store (the
    /// names stay taken until their TTL, as on a store whose connection
    /// closed); later calls are [`LockError::Unavailable`].
    async fn close(&self) -> Result<(), LockError> {
        self.client.closed.store(true, Ordering::Release);
        let owners = std::mem::take(&mut *self.owners());
        let state = self.lock();
        for grant in state
            .entries
            .values()
            .flat_map(|entry| entry.seats.iter().flatten())
            .filter(|grant| owners.contains(&grant.owner))
        {
            grant.evicted.cancel();
        }
        Ok(())
    }
}
