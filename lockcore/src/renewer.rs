//! One renewer per [`Locker`](crate::Locker): a single task keeps every
//! guard's lease alive.
//!
//! Holding 10,000 locks must not mean 10,000 tasks each sending its own
//! request every few seconds. The renewer keeps one entry per guard and
//! renews the leases that are due together, through
//! [`LockBackend::renew_many`] (one script, one statement, one keep-alive on
//! stores that can batch). Batching changes cost, never the guarantees: the
//! store still checks each lease's owner and fence, each guard adopts only
//! its own renewal and only if it was answered before that guard's deadline,
//! and each guard is lost at its own deadline.
//!
//! Renewals converge on one batch per interval: whenever some lease is due,
//! every lease at least halfway to its own renewal joins the batch (renewing
//! early is harmless), so after one interval all of them share a tick.
//!
//! Longer than 500 lines because the guard's side of a lease (`Held`) and the
//! task that judges it share its private state (times, loss, hold cap):
//! apart, every field would have to be crate-visible.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cleanups::Cleanups;
use crate::clock::{Clock, Moment};
use crate::metrics::{self, Tags};
use crate::{Backoff, Lease, LockBackend, LockError, LossReason};

/// How often the renewer looks at the clocks even when no timer is due:
/// timers run on the monotonic clock, which stops while the host is
/// suspended, so after a resume this bounds how late a loss is noticed.
const SUSPEND_CHECK: Duration = Duration::from_secs(1);

/// What a guard and the renewer share about one held lease.
pub(crate) struct Held {
    id: u64,
    pub(crate) backend: Arc<dyn LockBackend>,
    /// The lease's clock: every reading that judges it comes from there.
    clock: Arc<dyn Clock>,
    /// The locker's background work (releases of dropped guards).
    pub(crate) cleanups: Cleanups,
    lease: Mutex<Lease>,
    /// Cancelled when the lease is lost (a child of the store's own loss
    /// signal, so that one fires it without waiting for the renewer).
    pub(crate) lost: CancellationToken,
    store_lost: Option<CancellationToken>,
    reason: OnceLock<LossReason>,
    /// Cancelled when the guard is released or dropped.
    pub(crate) stop: CancellationToken,
    pub(crate) policy: HoldPolicy,
    acquired: Moment,
    pub(crate) tags: Tags,
    ended: AtomicBool,
    /// Set once the guard stopped holding or the lease was lost: what the
    /// renewer looks at every tick (cheaper than the tokens).
    done: AtomicBool,
}

/// What the renewer keeps of a lease to judge it without locking or
/// cloning it: when it was sent (on the lease's clock) and how long it
/// lasts from then (TTL minus margin).
#[derive(Debug, Clone, Copy)]
struct Times {
    issued: Moment,
    budget: Duration,
}

impl Times {
    fn of(lease: &Lease) -> Times {
        Times {
            issued: lease.issued(),
            budget: lease.ttl().get().saturating_sub(lease.margin()),
        }
    }

    fn deadline(&self) -> Instant {
        self.issued.mono() + self.budget
    }

    fn is_expired_at(&self, now: Moment) -> bool {
        now.since(self.issued) >= self.budget
    }
}

/// How a guard is kept.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HoldPolicy {
    /// Renew once this much has elapsed since the lease was issued.
    pub(crate) renew_every: Option<Duration>,
    /// Count the lease lost after this long, renewals or not.
    pub(crate) max_hold: Option<Duration>,
    /// Warn once after this long.
    pub(crate) long_hold: Option<Duration>,
}

impl Held {
    pub(crate) fn new(
        backend: Arc<dyn LockBackend>,
        cleanups: Cleanups,
        lease: Lease,
        policy: HoldPolicy,
        tags: Tags,
    ) -> Arc<Held> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let store_lost = lease.loss_signal().cloned();
        let lost = store_lost
            .as_ref()
            .map_or_else(CancellationToken::new, CancellationToken::child_token);
        let clock = lease.clock().clone();
        let held = Held {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            acquired: clock.now(),
            backend,
            clock,
            cleanups,
            lease: Mutex::new(lease),
            lost,
            store_lost,
            reason: OnceLock::new(),
            stop: CancellationToken::new(),
            policy,
            tags,
            ended: AtomicBool::new(false),
            done: AtomicBool::new(false),
        };
        metrics::hold_started(&held.tags);
        Arc::new(held)
    }

    /// How long since the grant's reply was received (the guard was made
    /// right then), on the lease's clock.
    pub(crate) fn held_for(&self) -> Duration {
        self.clock.now().since(self.acquired)
    }

    pub(crate) fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes a renewal of this grant as the current lease, its send time as
    /// the backend read it before sending (both clocks, never rebuilt from
    /// "now", which would erase a suspend while it was in flight). `None`,
    /// changing nothing, when `renewed` is not this grant (another name,
    /// owner, fence or slot: a backend that mixed up a batch) or when the
    /// guard is already lost or stopped: a lost lease is never resurrected.
    fn adopt(&self, renewed: Lease) -> Option<Times> {
        let mut lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if !lease.same_grant(&renewed) || self.done.load(Ordering::Acquire) {
            return None;
        }
        let times = Times::of(&renewed);
        *lease = renewed;
        Some(times)
    }

    fn times(&self) -> Times {
        Times::of(&self.lease.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether the lease is held. Once this answers `false` it never answers
    /// `true` again: a deadline seen passed marks the lease lost at once,
    /// and a renewal settling later is not adopted.
    pub(crate) fn is_held(&self) -> bool {
        if self.lost.is_cancelled() || self.done.load(Ordering::Acquire) {
            return false;
        }
        if self.lease().is_expired_at(self.clock.now()) {
            self.mark_lost(LossReason::DeadlinePassed);
            return false;
        }
        !self.lost.is_cancelled()
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.reason.get().cloned().or_else(|| {
            self.store_lost
                .as_ref()
                .filter(|t| t.is_cancelled())
                .map(|_| LossReason::StoreReported)
        })
    }

    /// Records why the lease was lost (once): a WARN event and a metric.
    fn note_loss(&self, reason: LossReason) {
        if self.reason.set(reason.clone()).is_ok() {
            let lease = self.lease();
            tracing::warn!(name = %lease.name(), fence = %lease.fence(), %reason, "lease lost");
            metrics::lost(&self.tags, &reason);
        }
    }

    /// The renewer lost the lease (a loss after the guard stopped holding is
    /// no loss).
    fn mark_lost(&self, reason: LossReason) {
        // `done` first: from here no renewal is adopted and `is_held` says no.
        self.done.store(true, Ordering::Release);
        if !self.stop.is_cancelled() {
            self.note_loss(reason);
        }
        self.lost.cancel();
        self.finish_hold();
    }

    /// The locker is closing: the lease counts as lost from now on.
    pub(crate) fn close(&self) {
        self.mark_lost(LossReason::Closed);
    }

    /// The guard stops holding (released or dropped). A loss the store had
    /// already reported is recorded now, if the renewer has not yet.
    pub(crate) fn stop_holding(&self) {
        self.done.store(true, Ordering::Release);
        self.stop.cancel();
        if self
            .store_lost
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
        {
            self.note_loss(LossReason::StoreReported);
        }
        self.finish_hold();
    }

    /// Counts the end of the hold, once.
    fn finish_hold(&self) {
        if !self.ended.swap(true, Ordering::Relaxed) {
            metrics::hold_ended(&self.tags, self.clock.now().since(self.acquired));
        }
    }
}

/// The handle a [`Locker`](crate::Locker) (and its clones) keeps: starts the
/// renewer task on first use, and again if the runtime it ran on is gone.
#[derive(Clone)]
pub(crate) struct Renewer {
    backend: Arc<dyn LockBackend>,
    task: Arc<Mutex<Option<mpsc::UnboundedSender<Msg>>>>,
}

/// What the renewer task is told.
enum Msg {
    /// Keep this guard.
    Keep(Arc<Held>),
    /// Stop keeping every guard and hand them over (the locker is closing).
    Drain(oneshot::Sender<Vec<Arc<Held>>>),
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Self {
        Renewer {
            backend,
            task: Arc::default(),
        }
    }

    /// Starts keeping `held` (renewing it, watching its deadlines) until it
    /// is stopped or lost. Must be called inside a tokio runtime.
    pub(crate) fn keep(&self, held: Arc<Held>) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = task.as_ref()
            && let Err(mpsc::error::SendError(msg)) = tx.send(Msg::Keep(held.clone()))
        {
            // The task is gone (its runtime shut down): start another.
            *task = None;
            drop(msg);
        } else if task.is_some() {
            return;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(self.backend.clone(), rx));
        let _ = tx.send(Msg::Keep(held));
        *task = Some(tx);
    }

    /// Every guard still kept, no longer kept: renewals stop for them.
    pub(crate) async fn drain(&self) -> Vec<Arc<Held>> {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|task| task.send(Msg::Drain(tx)).is_ok());
        if !sent {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }
}

type Batch = Pin<Box<dyn Future<Output = (Vec<u64>, Vec<Result<Lease, LockError>>)> + Send>>;
type Ended = Pin<Box<dyn Future<Output = u64> + Send>>;

/// The renewer's view of one guard.
struct Entry {
    held: Arc<Held>,
    /// The current lease's times (updated on every adoption).
    times: Times,
    /// A renewal of this lease is in flight.
    in_flight: bool,
    /// No renewal before this (backoff after an error, or just renewed).
    not_before: Instant,
    attempt: u32,
    warned: bool,
}

/// The renewer task: ends once every handle is dropped and nothing is held.
async fn run(backend: Arc<dyn LockBackend>, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let retry = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    let mut entries: HashMap<u64, Entry> = HashMap::new();
    let mut batches: FuturesUnordered<Batch> = FuturesUnordered::new();
    let mut ended: FuturesUnordered<Ended> = FuturesUnordered::new();
    let mut open = true;
    let mut next_wake = Instant::now() + SUSPEND_CHECK;
    loop {
        if !open && entries.is_empty() && batches.is_empty() {
            return;
        }
        tokio::select! {
            msg = rx.recv(), if open => match msg {
                None => open = false,
                Some(Msg::Drain(reply)) => {
                    // A guard that stopped holding (released, dropped, or
                    // left to expire at a time it set) may not have left
                    // yet: it is no longer the locker's to release.
                    let kept = entries
                        .drain()
                        .map(|(_, entry)| entry.held)
                        .filter(|held| !held.stop.is_cancelled())
                        .collect();
                    let _ = reply.send(kept);
                }
                Some(Msg::Keep(held)) => {
                    next_wake = next_wake.min(first_event(&held, Instant::now()));
                    ended.push(Box::pin(ends(held.clone())));
                    entries.insert(held.id, Entry {
                        times: held.times(),
                        held,
                        in_flight: false,
                        not_before: Instant::now(),
                        attempt: 0,
                        warned: false,
                    });
                }
            },
            Some((ids, results)) = batches.next(), if !batches.is_empty() => {
                let mut clocks = Clocks::default();
                let mono = Instant::now();
                for (id, outcome) in settle(&ids, results) {
                    let Some(entry) = entries.get_mut(&id) else { continue };
                    entry.in_flight = false;
                    let held = &entry.held;
                    let now = clocks.now(&held.clock);
                    match outcome {
                        Ok(renewed) => {
                            // Adopt only a reply that came before the old
                            // deadline; its own deadline counts from its send.
                            if entry.times.is_expired_at(now) {
                                held.mark_lost(LossReason::RenewalUnanswered);
                            } else if let Some(times) = held.adopt(renewed) {
                                entry.times = times;
                                entry.attempt = 0;
                                let every = held.policy.renew_every.unwrap_or(SUSPEND_CHECK);
                                entry.not_before = mono + every / 4;
                                // Nothing is due for it before then.
                                next_wake = next_wake.min(entry.not_before);
                            } else if !held.done.load(Ordering::Acquire) {
                                // Not this grant: a backend that mixed up its
                                // batch. Nothing proves this lease alive.
                                held.mark_lost(LossReason::RenewalFailed(
                                    "the backend answered the renewal with another lease".into(),
                                ));
                            }
                        }
                        Err(e @ LockError::NotHeld { .. }) => {
                            metrics::renewal_failed(&held.tags, &e);
                            held.mark_lost(LossReason::RenewalRefused);
                        }
                        Err(e) if entry.times.is_expired_at(now) => {
                            metrics::renewal_failed(&held.tags, &e);
                            held.mark_lost(LossReason::RenewalUnanswered);
                        }
                        Err(e) if e.is_retryable() => {
                            metrics::renewal_failed(&held.tags, &e);
                            tracing::debug!(error = %e, attempt = entry.attempt, "renewal failed, retrying");
                            entry.not_before = (mono + retry.delay(entry.attempt)).min(entry.times.deadline());
                            entry.attempt = entry.attempt.saturating_add(1);
                            next_wake = next_wake.min(entry.not_before);
                        }
                        Err(e) => {
                            metrics::renewal_failed(&held.tags, &e);
                            held.mark_lost(LossReason::RenewalFailed(e.to_string()));
                        }
                    }
                }
            },
            Some(id) = ended.next(), if !ended.is_empty() => {
                if let Some(entry) = entries.remove(&id)
                    && entry.held.store_lost.as_ref().is_some_and(CancellationToken::is_cancelled)
                {
                    entry.held.mark_lost(LossReason::StoreReported);
                }
            },
            _ = tokio::time::sleep_until(next_wake) => {
                next_wake = tick(&backend, &mut entries, &mut batches);
            },
        }
    }
}

/// Completes when the guard is stopped, or its lease lost (by the store or
/// by the renewer): the entry is dropped then.
async fn ends(held: Arc<Held>) -> u64 {
    tokio::select! {
        _ = held.stop.cancelled() => {}
        _ = held.lost.cancelled() => {}
    }
    held.id
}

/// One reading of each clock per pass: every guard of a locker usually
/// shares one, and reading two clocks per guard per tick is the renewer's
/// largest cost at 10,000 guards.
#[derive(Default)]
struct Clocks {
    last: Option<(*const (), Moment)>,
}

impl Clocks {
    fn now(&mut self, clock: &Arc<dyn Clock>) -> Moment {
        let key = Arc::as_ptr(clock).cast::<()>();
        match self.last {
            Some((k, now)) if k == key => now,
            _ => {
                let now = clock.now();
                self.last = Some((key, now));
                now
            }
        }
    }
}

/// Pairs each id with its outcome; a backend that returned too few or too
/// many outcomes fails the renewals it did not answer.
fn settle(
    ids: &[u64],
    results: Vec<Result<Lease, LockError>>,
) -> Vec<(u64, Result<Lease, LockError>)> {
    let got = results.len();
    let mut results = results.into_iter();
    ids.iter()
        .map(|&id| {
            let outcome = results.next().unwrap_or_else(|| {
                Err(LockError::store(
                    "renewer",
                    format!(
                        "renew_many returned {got} outcomes for {} leases",
                        ids.len()
                    ),
                ))
            });
            (id, outcome)
        })
        .collect()
}

/// The earliest instant anything can happen to `held`.
fn first_event(held: &Held, now: Instant) -> Instant {
    let lease = held.lease();
    let mut at = lease.deadline().min(now + SUSPEND_CHECK);
    if let Some(every) = held.policy.renew_every {
        at = at.min(lease.issued().mono() + every);
    }
    for cap in [held.policy.max_hold, held.policy.long_hold]
        .into_iter()
        .flatten()
    {
        at = at.min(now + cap);
    }
    at
}

/// Looks at every guard: loses those past their deadline or hold cap, warns
/// of long holds, and sends one batch of the renewals that are due. Returns
/// when to look again.
fn tick(
    backend: &Arc<dyn LockBackend>,
    entries: &mut HashMap<u64, Entry>,
    batches: &mut FuturesUnordered<Batch>,
) -> Instant {
    let mono = Instant::now();
    let mut next = mono + SUSPEND_CHECK;
    let (mut due, mut early) = (Vec::new(), Vec::new());
    let mut clocks = Clocks::default();
    entries.retain(|&id, entry| {
        let held = &entry.held;
        if held.done.load(Ordering::Relaxed) {
            return false;
        }
        let now = clocks.now(&held.clock);
        let times = entry.times;
        if times.is_expired_at(now) {
            // Renewals were tried and none was answered in time, or none was
            // due yet (auto-renew off, a host suspend).
            held.mark_lost(if entry.in_flight || entry.attempt > 0 {
                LossReason::RenewalUnanswered
            } else {
                LossReason::DeadlinePassed
            });
            return false;
        }
        let held_for = now.since(held.acquired);
        if let Some(cap) = held.policy.max_hold {
            if held_for >= cap {
                held.mark_lost(LossReason::MaxHoldExceeded);
                release_in_background(held);
                return false;
            }
            next = next.min(mono + (cap - held_for));
        }
        if let Some(threshold) = held.policy.long_hold
            && !entry.warned
        {
            if held_for >= threshold {
                entry.warned = true;
                let lease = held.lease();
                tracing::warn!(name = %lease.name(), fence = %lease.fence(), held_for = ?held_for, "lock held longer than the long-hold threshold");
                metrics::long_hold(&held.tags);
            } else {
                next = next.min(mono + (threshold - held_for));
            }
        }
        next = next.min(times.deadline());
        if let Some(every) = held.policy.renew_every
            && !entry.in_flight
        {
            let elapsed = now.since(times.issued);
            if mono < entry.not_before {
                next = next.min(entry.not_before);
            } else if elapsed >= every {
                due.push(id);
            } else {
                if elapsed >= every / 2 {
                    early.push(id);
                }
                next = next.min(mono + (every - elapsed));
            }
        }
        true
    });
    if !due.is_empty() {
        due.extend(early);
        let mut leases = Vec::with_capacity(due.len());
        for id in &due {
            if let Some(entry) = entries.get_mut(id) {
                entry.in_flight = true;
                leases.push(entry.held.lease());
            }
        }
        let until = leases.iter().map(Lease::deadline).max().unwrap_or(mono);
        let backend = backend.clone();
        let count = leases.len();
        batches.push(Box::pin(async move {
            let sent = Instant::now();
            let results = tokio::time::timeout_at(until, backend.renew_many(&leases)).await;
            metrics::renewal_batch(backend.capabilities().backend, sent.elapsed());
            let results = match results {
                Ok(results) => results,
                Err(_) => (0..count)
                    .map(|_| {
                        Err(LockError::unavailable(
                            "renewer",
                            "renewal unanswered before the deadline",
                        ))
                    })
                    .collect(),
            };
            (due, results)
        }));
        tracing::debug!(leases = count, "renewing");
    }
    next
}

/// Releases a lease the guard no longer may hold (owner-checked, so it never
/// touches a later holder), in the background on the locker's clean-ups.
pub(crate) fn release_in_background(held: &Held) {
    let backend = held.backend.clone();
    let lease = held.lease();
    let spawned = held.cleanups.spawn(async move {
        match backend.release(&lease).await {
            Ok(outcome) => {
                tracing::debug!(name = %lease.name(), fence = %lease.fence(), ?outcome, "released in the background")
            }
            Err(e) => {
                tracing::warn!(name = %lease.name(), error = %e, "background release failed; the lock expires after its TTL")
            }
        }
    });
    if !spawned {
        tracing::debug!("no runtime to release on; the lock expires after its TTL");
    }
}
