//! The suite must bite: each deliberately broken backend below violates one
//! guarantee, and the cases that check that guarantee must fail against it.
//! (`memory.rs` shows the same cases pass against the healthy backend.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::{Outcome, from_fn, run_cases, shared};
use lockcore::backend::{LockBackendExt, LockRequest, Polling, WaitPolicy, Wakeup, async_trait};
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
    /// Declares notifications but never wakes anyone.
    NeverWakes,
    /// A dropped acquire leaves a grant behind that never expires soon.
    LeaksCancelledWaiters,
    /// Panics on a lease it did not hand out.
    PanicsOnForgedLease,
}

#[derive(Debug, Clone)]
struct Broken {
    store: MemoryBackend,
    flaw: Flaw,
    /// For FenceRepeats: the real lease behind each owner's doctored one.
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

    fn doctor(&self, lease: Lease) -> Lease {
        if self.flaw != Flaw::FenceRepeats {
            return lease;
        }
        let fake = Lease::new(
            lease.name().clone(),
            lease.owner(),
            FencingToken::new(1).unwrap(),
            lease.checked_ttl(),
            lease.issued_at(),
        );
        self.real.lock().unwrap().insert(lease.owner(), lease);
        fake
    }
}

#[async_trait]
impl LockBackend for Broken {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let name = request.name();
        let asked = request.ttl();
        let ttl = match self.flaw {
            Flaw::ExpiresEarly => asked.get() / 2,
            Flaw::RaisesTtl => asked.get().max(Duration::from_secs(120)),
            _ => asked.get(),
        };
        Ok(match self.store.try_acquire_for(name, ttl).await? {
            Attempt::Acquired(lease)
                if matches!(self.flaw, Flaw::ExpiresEarly | Flaw::RaisesTtl) =>
            {
                Attempt::Acquired(Lease::new(
                    name.clone(),
                    lease.owner(),
                    lease.fence(),
                    asked,
                    lease.issued_at(),
                ))
            }
            Attempt::Acquired(lease) if self.flaw == Flaw::SilentEviction => {
                // The same grant without the store's loss signal.
                Attempt::Acquired(Lease::new(
                    name.clone(),
                    lease.owner(),
                    lease.fence(),
                    lease.checked_ttl(),
                    lease.issued(),
                ))
            }
            Attempt::Acquired(lease) => Attempt::Acquired(self.doctor(lease)),
            held => held,
        })
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let real = self.real(lease);
        match self.flaw {
            Flaw::PanicsOnForgedLease if self.store.inspect(lease.name()).await?.is_none() => {
                panic!("no such lease")
            }
            Flaw::RenewResurrects => match self.store.renew(&real).await {
                Err(LockError::NotHeld { .. }) => Ok(self
                    .store
                    .try_acquire_for(lease.name(), lease.ttl())
                    .await?
                    .into_lease()
                    .map(|l| lease.renewed(l.issued_at()))
                    .unwrap_or_else(|| lease.clone())),
                other => other,
            },
            Flaw::FenceRepeats => {
                let renewed = self.store.renew(&real).await?;
                self.real
                    .lock()
                    .unwrap()
                    .insert(lease.owner(), renewed.clone());
                Ok(lease.renewed(renewed.issued_at()))
            }
            _ => self.store.renew(&real).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        match self.flaw {
            Flaw::ReleaseIgnoresOwner => Ok(match self.store.evict(lease.name(), None).await? {
                Some(_) => ReleaseOutcome::Released,
                None => ReleaseOutcome::NotHeld,
            }),
            _ => self.store.release(&self.real(lease)).await,
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        self.store.inspect(name).await
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

    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        match self.flaw {
            Flaw::NeverWakes => Ok(Some(Box::pin(std::future::pending()))),
            _ => self.store.watch(name).await,
        }
    }

    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        if self.flaw != Flaw::LeaksCancelledWaiters {
            return lockcore::wait::wait(wait, &mut Polling::new(self, request)).await;
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
    must_fail(Flaw::SilentEviction, &["lost_fires_on_force_release"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wakeups_are_caught() {
    must_fail(Flaw::NeverWakes, &["waiter_wakes_on_release"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_waiters_are_caught() {
    must_fail(
        Flaw::LeaksCancelledWaiters,
        &["cancelled_acquire_leaves_nothing"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_are_caught() {
    must_fail(Flaw::PanicsOnForgedLease, &["forged_leases_are_refused"]).await;
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
