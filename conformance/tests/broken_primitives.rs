//! The cases for labels, hold caps, wake-ups, semaphores, elections, the
//! fence floor and atomic multi-locks must bite: each deliberately broken backend below (a
//! `MemoryBackend` with one flaw) violates one of those guarantees, and the
//! cases that check it must fail against it. (`memory.rs` shows the same
//! cases pass against the healthy backend.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::{from_fn, run_cases, shared};
use lockcore::backend::wait::{self, WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockBackendExt, LockRequest, Moment, Polling, Ttl, async_trait};
use lockcore::{
    Attempt, AttemptEach, Capabilities, FencingToken, Holder, HolderLabel, Lease, LockBackend,
    LockError, LockName, MemoryBackend, OwnerToken, ReleaseOutcome,
};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// Grants a held lock to anyone asking with the holder's label.
    ReentrantByLabel,
    /// Release frees the name for a lease granted under the holder's label.
    ReleaseByLabel,
    /// Renew extends the holder's lease for a lease granted under its label.
    RenewByLabel,
    /// `inspect` and `inspect_permits` forget labels.
    DropsLabel,
    /// Release answers `Released` and changes nothing.
    IgnoresRelease,
    /// Renew answers with a renewed lease and extends nothing.
    RenewDoesNotExtend,
    /// Declares notifications, but `watch` and `watch_permits` return `None`.
    WatchReturnsNone,
    /// Wake-ups that never come.
    NeverWakes,
    /// Wake-ups that come at once, change or not.
    WakesAtOnce,
    /// One permit more than asked.
    OverGrants,
    /// Every grant, lock or permit, reports fencing token 1.
    FenceRepeats,
    /// Grants stay ten minutes on the store whatever the TTL (the lease
    /// reports the TTL asked for).
    NeverExpires,
    /// Every semaphore has 64 permits, whatever was asked.
    IgnoresPermitCount,
    /// A dropped permit wait goes on in a detached task and takes a permit.
    LeaksPermitWaiters,
    /// `inspect` serves the first answer it gave for a name for ten seconds
    /// (a stale read replica).
    StaleInspect,
    /// `raise_fence_floor` answers `Ok` and does nothing.
    IgnoresFenceFloor,
    /// An "atomic" multi-lock attempt that takes the free names and keeps
    /// them when another is held.
    PartialMultiGrant,
}

const FOR_LONG: Duration = Duration::from_secs(600);

/// What the wrapper remembers of a grant it handed out.
#[derive(Debug, Clone)]
struct Granted {
    /// The store's lease behind the (possibly doctored) one handed out.
    real: Lease,
    label: HolderLabel,
}

type Inspected = (Instant, Option<Holder>);

#[derive(Debug, Clone)]
struct Broken {
    store: MemoryBackend,
    flaw: Flaw,
    grants: Arc<Mutex<HashMap<OwnerToken, Granted>>>,
    /// For `StaleInspect`: the first answer per name, and when it was given.
    inspected: Arc<Mutex<HashMap<LockName, Inspected>>>,
}

impl Broken {
    fn new(flaw: Flaw) -> Self {
        Broken {
            store: MemoryBackend::new(),
            flaw,
            grants: Arc::default(),
            inspected: Arc::default(),
        }
    }

    fn granted(&self, owner: OwnerToken) -> Option<Granted> {
        self.grants.lock().unwrap().get(&owner).cloned()
    }

    fn real(&self, lease: &Lease) -> Lease {
        self.granted(lease.owner())
            .map_or_else(|| lease.clone(), |g| g.real)
    }

    /// The request the store sees.
    fn stored(&self, request: &LockRequest) -> LockRequest {
        if self.flaw != Flaw::NeverExpires {
            return request.clone();
        }
        let ttl = self.capabilities().effective_ttl(FOR_LONG).unwrap();
        LockRequest::new(request.name().clone(), ttl).with_label(request.label().clone())
    }

    /// Records a grant and hands out the lease the flaw calls for.
    fn hand_out(&self, attempt: Attempt, asked: Ttl, label: &HolderLabel) -> Attempt {
        let Attempt::Acquired(real) = attempt else {
            return attempt;
        };
        self.grants.lock().unwrap().insert(
            real.owner(),
            Granted {
                real: real.clone(),
                label: label.clone(),
            },
        );
        let fence = match self.flaw {
            Flaw::FenceRepeats => FencingToken::new(1).unwrap(),
            _ => real.fence(),
        };
        let mut lease = Lease::new(
            real.name().clone(),
            real.owner(),
            fence,
            asked,
            real.issued(),
        );
        if let Some(slot) = real.slot() {
            lease = lease.with_slot(slot);
        }
        if let Some(lost) = real.loss_signal() {
            lease = lease.with_loss_signal(lost.clone());
        }
        Attempt::Acquired(lease)
    }

    /// The holder's grant if it was granted under `label`.
    async fn holder_labelled(&self, name: &LockName, owner: OwnerToken) -> Option<Granted> {
        let label = self.granted(owner)?.label;
        let holder = self.store.inspect(name).await.ok()??;
        self.granted(holder.owner?).filter(|g| g.label == label)
    }

    fn wakeup(&self, armed: Option<Wakeup>) -> Option<Wakeup> {
        match self.flaw {
            Flaw::WatchReturnsNone => None,
            Flaw::NeverWakes => Some(Box::pin(std::future::pending())),
            Flaw::WakesAtOnce => Some(Box::pin(std::future::ready(()))),
            _ => armed,
        }
    }

    fn unlabelled(&self, holder: Holder) -> Holder {
        match self.flaw {
            Flaw::DropsLabel => holder.with_label(None),
            _ => holder,
        }
    }
}

#[async_trait]
impl LockBackend for Broken {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        if let Some(permits) = request.permits() {
            let stored = match self.flaw {
                Flaw::OverGrants => permits + 1,
                Flaw::IgnoresPermitCount => 64,
                _ => permits,
            };
            let asked = self.stored(request).with_permits(stored);
            let attempt = self.store.try_acquire(&asked).await?;
            return Ok(self.hand_out(attempt, request.ttl(), request.label()));
        }
        let attempt = self.store.try_acquire(&self.stored(request)).await?;
        if self.flaw == Flaw::ReentrantByLabel
            && matches!(attempt, Attempt::Held { .. })
            && let Some(holder) = self.store.inspect(request.name()).await?
            && let Some(granted) = holder.owner.and_then(|o| self.granted(o))
            && granted.label == *request.label()
        {
            return Ok(Attempt::Acquired(granted.real));
        }
        Ok(self.hand_out(attempt, request.ttl(), request.label()))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        match self.flaw {
            Flaw::RenewDoesNotExtend => return Ok(lease.renewed(Moment::now())),
            Flaw::RenewByLabel if lease.slot().is_none() => {
                if let Some(holder) = self.holder_labelled(lease.name(), lease.owner()).await {
                    let renewed = self.store.renew(&holder.real).await?;
                    return Ok(lease.renewed(renewed.issued()));
                }
            }
            _ => {}
        }
        let renewed = self.store.renew(&self.real(lease)).await?;
        if let Some(granted) = self.grants.lock().unwrap().get_mut(&lease.owner()) {
            granted.real = renewed.clone();
        }
        Ok(lease.renewed(renewed.issued()))
    }

    /// Each lease through the flawed [`renew`](Self::renew), one by one.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut renewed = Vec::with_capacity(leases.len());
        for lease in leases {
            renewed.push(self.renew(lease).await);
        }
        renewed
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        match self.flaw {
            Flaw::IgnoresRelease => Ok(ReleaseOutcome::Released),
            Flaw::ReleaseByLabel if lease.slot().is_none() => {
                match self.holder_labelled(lease.name(), lease.owner()).await {
                    Some(holder) => self.store.release(&holder.real).await,
                    None => self.store.release(&self.real(lease)).await,
                }
            }
            _ => self.store.release(&self.real(lease)).await,
        }
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        if kind == Kind::Semaphore {
            let holders = self.store.inspect_permits(name).await?;
            return Ok(holders.into_iter().map(|h| self.unlabelled(h)).collect());
        }
        if self.flaw == Flaw::StaleInspect {
            if let Some((at, holder)) = self.inspected.lock().unwrap().get(name)
                && at.elapsed() < Duration::from_secs(10)
            {
                return Ok(holder.clone().into_iter().collect());
            }
            let holder = self.store.inspect(name).await?;
            self.inspected
                .lock()
                .unwrap()
                .insert(name.clone(), (Instant::now(), holder.clone()));
            return Ok(holder.into_iter().collect());
        }
        let holder = self.store.inspect(name).await?;
        Ok(holder.map(|h| self.unlabelled(h)).into_iter().collect())
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.store.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        Ok(self.wakeup(self.store.watch(name, kind).await?))
    }

    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let (Some(permits), Flaw::LeaksPermitWaiters) = (request.permits(), self.flaw) else {
            return wait::wait(wait, &mut Polling::new(self, request)).await;
        };
        // The waiting happens in a detached task that goes on (and takes a
        // permit for a long time) after the caller has gone away.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (store, mut wait) = (self.store.clone(), wait.clone());
        let ttl = self.capabilities().effective_ttl(FOR_LONG)?;
        let request = LockRequest::new(request.name().clone(), ttl).with_permits(permits);
        wait.deadline = Instant::now() + FOR_LONG;
        tokio::spawn(async move {
            let _ = tx.send(store.acquire(&request, &wait).await);
        });
        rx.await.unwrap_or(Ok(None))
    }

    /// Only the flawed one: the other flaws take a multi-lock's names one
    /// by one (the locker's fallback when this answers `Unsupported`).
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        if self.flaw != Flaw::PartialMultiGrant {
            return Err(LockError::Unsupported {
                backend: "broken",
                operation: "try_acquire_each",
            });
        }
        let (mut leases, mut held) = (Vec::new(), None);
        for request in requests {
            match self.try_acquire(request).await? {
                Attempt::Acquired(lease) => leases.push(lease),
                Attempt::Held { expires_in } => {
                    held.get_or_insert((request.name().clone(), expires_in));
                }
            }
        }
        Ok(match held {
            Some((name, expires_in)) => AttemptEach::Held { name, expires_in },
            None => AttemptEach::Acquired(leases),
        })
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        match self.flaw {
            Flaw::IgnoresFenceFloor => Ok(()),
            _ => self.store.raise_fence_floor(floor).await,
        }
    }
}

/// Runs `cases` against the flawed backend and checks each one fails.
async fn must_fail(flaw: Flaw, cases: &[&str]) {
    let report = run_cases(shared(Broken::new(flaw)), |c| cases.contains(&c.name)).await;
    assert_eq!(
        report.cases.len(),
        cases.len(),
        "unknown case name in {cases:?}"
    );
    for case in &report.cases {
        assert!(
            case.result.is_err(),
            "{flaw:?}: case {} should fail but {:?}",
            case.name,
            case.result
        );
    }
    println!("{flaw:?}:\n{report}\n");
}

macro_rules! caught {
    ($($test:ident: $flaw:ident => [$($case:ident),+ $(,)?];)+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            must_fail(Flaw::$flaw, &[$(stringify!($case)),+]).await;
        }
    )+};
}

caught! {
    label_reentrancy_is_caught: ReentrantByLabel => [labels_never_decide_ownership];
    release_by_label_is_caught: ReleaseByLabel => [labels_never_decide_ownership];
    renew_by_label_is_caught: RenewByLabel => [labels_never_decide_ownership];
    dropped_labels_are_caught: DropsLabel => [labels_round_trip_through_inspect, default_label_is_host_and_pid];
    ignored_release_is_caught: IgnoresRelease => [max_hold_ends_the_hold, watch_wakes_on_release, watch_permits_wakes_on_release, cancelled_permit_wait_leaves_nothing, one_leader_at_a_time];
    renewals_that_extend_nothing_are_caught: RenewDoesNotExtend => [max_hold_ends_the_hold];
    missing_watch_is_caught: WatchReturnsNone => [watch_wakes_on_release, watch_permits_wakes_on_release];
    missing_wakeups_are_caught: NeverWakes => [watch_wakes_on_release, watch_permits_wakes_on_release];
    spurious_wakeups_are_caught: WakesAtOnce => [watch_wakes_on_release, watch_permits_wakes_on_release];
    over_granting_is_caught: OverGrants => [permits_never_exceed_n];
    repeating_fences_are_caught: FenceRepeats => [permits_never_exceed_n, stale_slot_holder_is_refused, one_leader_at_a_time, fence_floor_lifts_every_grant];
    leases_that_never_expire_are_caught: NeverExpires => [crashed_permit_holder_frees_its_slot, stale_slot_holder_is_refused, dead_leader_is_replaced];
    ignored_permit_counts_are_caught: IgnoresPermitCount => [permit_count_disagreement_is_refused, permits_never_exceed_n, zero_permits_are_refused];
    leaked_permit_waiters_are_caught: LeaksPermitWaiters => [cancelled_permit_wait_leaves_nothing];
    stale_inspect_is_caught: StaleInspect => [observers_see_every_change];
    ignored_fence_floor_is_caught: IgnoresFenceFloor => [fence_floor_lifts_every_grant, fence_floor_lifts_a_waiter_queued_before_it];
    partial_multi_grants_are_caught: PartialMultiGrant => [multi_lock_waits_holding_nothing, multi_lock_is_all_or_nothing];
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_brain_elections_are_caught() {
    // Each client talks to its own store: every candidate leads at once.
    let factory = from_fn(|| async { Ok(MemoryBackend::new()) });
    let cases = ["one_leader_at_a_time", "permits_never_exceed_n"];
    let report = run_cases(factory, |c| cases.contains(&c.name)).await;
    assert_eq!(report.cases.len(), cases.len());
    assert!(report.cases.iter().all(|c| c.result.is_err()), "{report}");
    println!("no exclusion:\n{report}\n");
}
