//! The suite must bite: each deliberately broken backend below violates one
//! guarantee, and the cases that check that guarantee must fail against it.
//! (`memory.rs` shows the same cases pass against the healthy backend.)
//!
//! Longer than 500 lines because every flaw is an arm of one wrapper
//! backend: split up, each file would carry its own copy of the wrapper.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::{Outcome, from_fn, run_cases, shared};
use lockcore::backend::wait::{self, WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockBackendExt, LockRequest, Moment, Polling, Ttl, async_trait};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    MemoryBackend, OwnerToken, ReleaseOutcome,
};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// Release deletes whoever holds the name (GET-then-DEL done wrong).
    ReleaseIgnoresOwner,
    /// Every grant gets fencing token 1.
    FenceRepeats,
    /// Renew re-creates an expired lock instead of refusing.
    RenewResurrects,
    /// The store enforces half the TTL it reports.
    ExpiresEarly,
    /// Short TTLs are silently raised to a store minimum (etcd's habit) while
    /// the lease reports the TTL asked for. (Zero or huge TTLs cannot reach a
    /// backend at all: the trait takes a validated `Ttl`.)
    RaisesTtl,
    /// Compare-and-evict evicts whoever holds the name, whatever fence it
    /// was asked to compare.
    EvictIgnoresFence,
    /// Declares an eviction notice but never tells the evicted holder.
    SilentEviction,
    /// An evicted holder never hears: no notice, and its renewals take the
    /// name again instead of failing.
    DeafHolder,
    /// Declares notifications but never wakes anyone.
    NeverWakes,
    /// A dropped acquire leaves a grant behind that never expires soon.
    LeaksCancelledWaiters,
    /// Panics on a lease it did not hand out.
    PanicsOnForgedLease,
    /// A slow store (`LAG` each way), and lease deadlines counted from the
    /// reply instead of the send time.
    StampsTheReply,
    /// No drift margin: leases are stamped `sent + drift`.
    NoDriftMargin,
    /// Renew's first attempt renews on the store but "loses its reply"; the
    /// backend retries after the caller's deadline and returns a lease
    /// stamped with that late retry's send time.
    RenewAdoptedLate,
    /// The store enforces the TTL, but leases report TTL + TTL/3: the holder
    /// counts on its lock one renew interval past the store's expiry.
    LossOneIntervalLate,
    /// A batch renewal takes its first lease's answer for every lease (one
    /// verdict for a whole batch statement).
    OneVerdictPerBatch,
    /// `close` does nothing: the client keeps serving, its leases' loss
    /// signals never fire.
    CloseKeepsServing,
    /// Accepts (and ignores) a fence floor it could not count past.
    AcceptsAnyFloor,
    /// `set_remaining` renews by the lease's own TTL, whatever time it is
    /// given (and reports the time given).
    SetRemainingIgnoresTime,
    /// `set_remaining` releases the lease instead (and says it kept it).
    SetRemainingReleases,
}

/// `d` as a TTL the in-memory store accepts.
fn checked(d: Duration) -> Ttl {
    MemoryBackend::new()
        .capabilities()
        .effective_ttl(d)
        .expect("a valid TTL")
}

/// How slow the store of `Flaw::StampsTheReply` is, each way.
const LAG: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
struct Broken {
    store: MemoryBackend,
    flaw: Flaw,
    /// The real lease behind each owner's doctored one.
    real: Arc<Mutex<HashMap<OwnerToken, Lease>>>,
}

impl Broken {
    fn new(flaw: Flaw) -> Self {
        Broken {
            store: MemoryBackend::new(),
            flaw,
            real: Arc::default(),
        }
    }

    fn real(&self, lease: &Lease) -> Lease {
        self.real
            .lock()
            .unwrap()
            .get(&lease.owner())
            .cloned()
            .unwrap_or_else(|| lease.clone())
    }

    /// What the flawed backend hands out for the store's `lease`, granted or
    /// renewed by a call sent at `sent`.
    fn doctor(&self, lease: Lease, sent: Moment) -> Lease {
        let ttl = lease.ttl().get();
        let fake = match self.flaw {
            Flaw::FenceRepeats => Lease::new(
                lease.name().clone(),
                lease.owner(),
                FencingToken::new(1).unwrap(),
                lease.ttl(),
                lease.issued(),
            ),
            Flaw::LossOneIntervalLate => lease.clone().with_ttl(checked(ttl + ttl / 3)),
            Flaw::StampsTheReply => return lease.renewed(Moment::now()),
            Flaw::NoDriftMargin => return lease.renewed(sent.after(Lease::drift(ttl))),
            _ => return lease,
        };
        self.real.lock().unwrap().insert(lease.owner(), lease);
        fake
    }

    /// One way of the slow store's round trip.
    async fn lag(&self) {
        if self.flaw == Flaw::StampsTheReply {
            tokio::time::sleep(LAG).await;
        }
    }

    async fn flawed_try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        if request.permits().is_some() {
            return self.store.try_acquire(request).await;
        }
        let (name, asked) = (request.name(), request.ttl());
        let ttl = match self.flaw {
            Flaw::ExpiresEarly => asked.get() / 2,
            Flaw::RaisesTtl => asked.get().max(Duration::from_secs(120)),
            _ => asked.get(),
        };
        let ttl = checked(ttl);
        let flawed = LockRequest::new(name.clone(), ttl).with_label(request.label().clone());
        Ok(match self.store.try_acquire(&flawed).await? {
            Attempt::Acquired(lease)
                if matches!(self.flaw, Flaw::ExpiresEarly | Flaw::RaisesTtl) =>
            {
                Attempt::Acquired(lease.with_ttl(asked))
            }
            Attempt::Acquired(lease)
                if matches!(self.flaw, Flaw::SilentEviction | Flaw::DeafHolder) =>
            {
                // The same grant without the store's loss signal.
                Attempt::Acquired(Lease::new(
                    name.clone(),
                    lease.owner(),
                    lease.fence(),
                    lease.ttl(),
                    lease.issued(),
                ))
            }
            attempt => attempt,
        })
    }

    async fn flawed_renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let real = self.real(lease);
        match self.flaw {
            Flaw::PanicsOnForgedLease if self.store.inspect(lease.name()).await?.is_none() => {
                panic!("no such lease")
            }
            Flaw::RenewResurrects | Flaw::DeafHolder => match self.store.renew(&real).await {
                Err(LockError::NotHeld { .. }) => Ok(self
                    .store
                    .try_acquire_for(lease.name(), lease.ttl().get())
                    .await?
                    .into_lease()
                    .map(|l| lease.renewed(l.issued()))
                    .unwrap_or_else(|| lease.clone())),
                other => other,
            },
            Flaw::RenewAdoptedLate => {
                // The first attempt renews; its reply "is lost". The retry
                // comes after the caller's deadline and is stamped with its
                // own send time.
                self.store.renew(&real).await?;
                tokio::time::sleep_until(lease.deadline() + Duration::from_millis(1)).await;
                let retried = Moment::now();
                let renewed = self.store.renew(&real).await?;
                Ok(renewed.renewed(retried))
            }
            _ => self.store.renew(&real).await,
        }
    }
}

#[async_trait]
impl LockBackend for Broken {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let sent = Moment::now();
        self.lag().await;
        let attempt = self.flawed_try_acquire(request).await;
        self.lag().await;
        Ok(match attempt? {
            Attempt::Acquired(lease) => Attempt::Acquired(self.doctor(lease, sent)),
            held => held,
        })
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let sent = Moment::now();
        self.lag().await;
        let renewed = self.flawed_renew(lease).await;
        self.lag().await;
        Ok(self.doctor(renewed?, sent))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let Some(first) = leases
            .first()
            .filter(|_| self.flaw == Flaw::OneVerdictPerBatch)
        else {
            return futures::future::join_all(leases.iter().map(|lease| self.renew(lease))).await;
        };
        let verdict = self.renew(first).await.map(|_| Moment::now());
        (leases.iter())
            .map(|lease| match &verdict {
                Ok(sent) => Ok(lease.renewed(*sent)),
                Err(_) => Err(LockError::NotHeld {
                    name: lease.name().clone(),
                }),
            })
            .collect()
    }

    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        let real = self.real(lease);
        match self.flaw {
            Flaw::SetRemainingIgnoresTime => Ok(self.store.renew(&real).await?.with_ttl(remaining)),
            Flaw::SetRemainingReleases => {
                self.store.release(&real).await?;
                Ok(lease.clone().with_ttl(remaining))
            }
            _ => self.store.set_remaining(&real, remaining).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.lag().await;
        let outcome = match self.flaw {
            Flaw::ReleaseIgnoresOwner => match self.store.evict(lease.name(), None).await {
                Ok(Some(_)) => Ok(ReleaseOutcome::Released),
                Ok(None) => Ok(ReleaseOutcome::NotHeld),
                Err(e) => Err(e),
            },
            _ => self.store.release(&self.real(lease)).await,
        };
        self.lag().await;
        outcome
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.lag().await;
        let holders = self.store.holders(name, kind).await;
        self.lag().await;
        holders
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        match self.flaw {
            Flaw::EvictIgnoresFence => self.store.evict(name, None).await,
            _ => self.store.evict(name, expected).await,
        }
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        match self.flaw {
            Flaw::NeverWakes => Ok(Some(Box::pin(std::future::pending()))),
            _ => self.store.watch(name, kind).await,
        }
    }

    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        if self.flaw != Flaw::LeaksCancelledWaiters {
            return wait::wait(wait, &mut Polling::new(self, request)).await;
        }
        // The waiting happens in a detached task that takes the lock for a
        // long time even if the caller has gone away: a leaked queue entry.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (store, name, mut wait) = (self.store.clone(), request.name().clone(), wait.clone());
        wait.deadline = Instant::now() + Duration::from_secs(600);
        tokio::spawn(async move {
            let got = store
                .acquire_for(&name, Duration::from_secs(600), &wait)
                .await;
            let _ = tx.send(got);
        });
        rx.await.unwrap_or(Ok(None))
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        match self.flaw {
            Flaw::AcceptsAnyFloor if floor.get() > self.capabilities().max_fence_floor() => Ok(()),
            _ => self.store.raise_fence_floor(floor).await,
        }
    }

    async fn close(&self) -> Result<(), LockError> {
        match self.flaw {
            Flaw::CloseKeepsServing => Ok(()),
            _ => self.store.close().await,
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

/// Runs the cases of `expected` against the flawed backend and checks each
/// one fails, for the reason given (see `Report::assert_failed_saying`).
async fn must_fail_saying(flaw: Flaw, expected: &[(&str, &str)]) {
    let report = run_cases(shared(Broken::new(flaw)), |c| {
        expected.iter().any(|(name, _)| *name == c.name)
    })
    .await;
    println!("{flaw:?}:\n{report}\n");
    report.assert_failed_saying(expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_unchecked_release_is_caught() {
    must_fail(
        Flaw::ReleaseIgnoresOwner,
        &[
            "release_is_owner_checked",
            "release_is_idempotent",
            "renew_after_expiry_fails",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeating_fences_are_caught() {
    must_fail(
        Flaw::FenceRepeats,
        &[
            "fences_increase_across_cycles",
            "release_is_idempotent",
            "force_release_fences_out_the_holder",
            "every_waiter_is_served",
            "random_workload_history_is_clean",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_exclusion_is_caught() {
    // Each client talks to its own store: nothing is exclusive across clients.
    let factory = from_fn(|| async { Ok(MemoryBackend::new()) });
    let cases = [
        "exclusive_between_clients",
        "independent_names",
        "fenced_counter_is_exact",
        "odd_names_are_distinct_locks",
        "multi_lock_is_all_or_nothing",
        "multi_lock_opposite_orders_never_overlap",
    ];
    let report = run_cases(factory, |c| cases.contains(&c.name)).await;
    assert_eq!(report.cases.len(), cases.len());
    assert!(report.cases.iter().all(|c| c.result.is_err()), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resurrecting_renewals_are_caught() {
    must_fail(Flaw::RenewResurrects, &["renew_after_expiry_fails"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_verdict_for_a_whole_batch_is_caught() {
    must_fail_saying(
        Flaw::OneVerdictPerBatch,
        &[(
            "renew_many_judges_each_lease",
            "each lease must be judged on its own",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_expiry_is_caught() {
    must_fail(
        Flaw::ExpiresEarly,
        &["expiry_frees_the_name", "waiter_wakes_on_expiry"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silently_raised_ttls_are_caught() {
    must_fail(Flaw::RaisesTtl, &["effective_ttl_is_truthful"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_blind_eviction_is_caught() {
    must_fail(
        Flaw::EvictIgnoresFence,
        &["force_release_fences_out_the_holder"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_eviction_is_caught() {
    must_fail(
        Flaw::SilentEviction,
        &[
            "lost_fires_on_force_release",
            "multi_lock_is_lost_with_any_member",
        ],
    )
    .await;
}

/// The critical section of a holder that never hears of its eviction runs
/// on: the case reports it still running at its bound, instead of waiting
/// for it without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deaf_holders_are_caught() {
    must_fail_saying(
        Flaw::DeafHolder,
        &[(
            "with_lock_stops_when_lost",
            "the critical section still ran",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wakeups_are_caught() {
    must_fail(Flaw::NeverWakes, &["waiter_wakes_on_release"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_waiters_are_caught() {
    must_fail(
        Flaw::LeaksCancelledWaiters,
        &[
            "cancelled_acquire_leaves_nothing",
            "closed_waiter_leaves_nothing",
        ],
    )
    .await;
    must_fail_saying(
        Flaw::LeaksCancelledWaiters,
        &[(
            "multi_lock_leaves_nothing_behind",
            // The leaked waiter takes the last name once it is free, or
            // (when a poll takes it first) the next wait overstays.
            "was not free within || had not returned after",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_are_caught() {
    must_fail(Flaw::PanicsOnForgedLease, &["forged_leases_are_refused"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_counted_from_the_reply_are_caught() {
    must_fail_saying(
        Flaw::StampsTheReply,
        &[
            ("effective_ttl_is_truthful", "past send time + TTL - drift"),
            ("renew_extends_and_keeps_fence", "send time"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_drift_margin_is_caught() {
    must_fail_saying(
        Flaw::NoDriftMargin,
        &[("effective_ttl_is_truthful", "past send time + TTL - drift")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_adopted_after_the_deadline_are_caught() {
    must_fail_saying(
        Flaw::RenewAdoptedLate,
        &[(
            "renew_extends_and_keeps_fence",
            "past the renew call's send time + TTL",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_one_interval_late_is_caught() {
    must_fail_saying(
        Flaw::LossOneIntervalLate,
        &[
            ("effective_ttl_is_truthful", "capabilities predict"),
            (
                "expiry_frees_the_name",
                "before the holder's local deadline",
            ),
            (
                "waiter_wakes_on_expiry",
                "before the holder's local deadline",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_that_keeps_serving_is_caught() {
    must_fail_saying(
        Flaw::CloseKeepsServing,
        &[(
            "close_loses_and_frees_what_it_held",
            "must refuse work with Unavailable",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_beyond_the_counter_accepted_is_caught() {
    must_fail_saying(
        Flaw::AcceptsAnyFloor,
        &[(
            "fence_floor_beyond_the_counter_is_refused",
            "expected InvalidConfig",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_remaining_that_ignores_the_time_is_caught() {
    must_fail_saying(
        Flaw::SetRemainingIgnoresTime,
        &[
            ("job_at_least_holds_on_the_stores_clock", "a second job ran"),
            (
                "job_once_per_window_holds_across_nodes",
                "just before its window ended",
            ),
            (
                "set_remaining_is_exact_and_owner_checked",
                "acquisition after a shortened lease ran out",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_remaining_that_releases_is_caught() {
    must_fail_saying(
        Flaw::SetRemainingReleases,
        &[
            (
                "job_at_least_holds_on_the_stores_clock",
                "right after the first job ended",
            ),
            (
                "job_once_per_window_holds_across_nodes",
                "right after the first run",
            ),
            (
                "set_remaining_is_exact_and_owner_checked",
                "another owner should be NotHeld",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_on_an_early_expiring_or_fence_repeating_store_are_caught() {
    must_fail_saying(
        Flaw::ExpiresEarly,
        &[(
            "crashed_job_frees_at_at_most",
            // Checked while the lease should hold, if enough of it is left
            // by then; else when the next run comes too early.
            "while the crashed one's lease || before the end of the crashed job's at_most",
        )],
    )
    .await;
    must_fail_saying(
        Flaw::FenceRepeats,
        &[("job_fence_grows_per_run", "round 1: ")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_healthy_backend_passes_the_same_cases() {
    let report = lock_conformance::run_all(shared(MemoryBackend::new())).await;
    report.assert_passed();
    // The fault and cross-process cases need a store process (and the
    // `stores` feature): they skip on MemoryBackend, saying why. Nothing else may.
    assert!(
        report
            .cases
            .iter()
            .filter(|c| !matches!(c.group, "faults" | "processes" | "clock" | "nemesis"))
            .all(|c| c.result == Ok(Outcome::Passed)),
        "nothing but store-fault cases should skip on MemoryBackend:\n{report}"
    );
    assert!(
        report
            .skipped()
            .all(|c| matches!(&c.result, Ok(Outcome::Skipped(why)) if !why.is_empty())),
        "every skip says why:\n{report}"
    );
}
