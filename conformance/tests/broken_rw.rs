//! The reader-writer lock cases must bite: each deliberately broken backend
//! below (a `MemoryBackend` with one flaw in its reader-writer locks)
//! violates one guarantee of `RwLock`, and the cases that check it must
//! fail against it. (`memory.rs` shows the same cases pass against the
//! healthy backend.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::{run_cases, shared};
use lockcore::backend::wait::{self, WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockRequest, Polling, Ttl, async_trait};
use lockcore::{
    Access, Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    MemoryBackend, OwnerToken, ReleaseOutcome,
};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// A write is granted as a read share (and reported as a write).
    SharedWrites,
    /// Waiting writers leave no intent: readers keep coming before them.
    NoWriterPreference,
    /// A writer that gave up keeps waiting in a detached task: its intent
    /// stays, and readers are kept out.
    LeaksWriterIntents,
    /// Every grant, read or write, reports fencing token 1.
    FenceRepeats,
    /// Grants stay ten minutes on the store whatever the TTL (the lease
    /// reports the TTL asked for).
    NeverExpires,
    /// The store enforces half the TTL the lease reports.
    ExpiresEarly,
}

const FOR_LONG: Duration = Duration::from_secs(600);

/// `d` as a TTL the in-memory store accepts.
fn checked(d: Duration) -> Ttl {
    MemoryBackend::new()
        .capabilities()
        .effective_ttl(d)
        .expect("a valid TTL")
}

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

    /// What the flawed backend asks its store for instead of `request`.
    fn flawed(&self, request: &LockRequest) -> LockRequest {
        let Some(access) = request.access() else {
            return request.clone();
        };
        let asked = request.ttl().get();
        let (access, ttl) = match self.flaw {
            Flaw::SharedWrites => (Access::Read, asked),
            Flaw::NeverExpires => (access, FOR_LONG),
            Flaw::ExpiresEarly => (access, asked / 2),
            _ => (access, asked),
        };
        LockRequest::new(request.name().clone(), checked(ttl))
            .with_label(request.label().clone())
            .with_clock(request.clock().clone())
            .with_access(access)
    }

    /// What the flawed backend hands out for the store's `lease`, granted
    /// for `request`.
    fn doctor(&self, lease: Lease, request: &LockRequest) -> Lease {
        let Some(access) = request.access() else {
            return lease;
        };
        let fence = match self.flaw {
            Flaw::FenceRepeats => FencingToken::new(1).expect("1 is a fence"),
            _ => lease.fence(),
        };
        let fake = Lease::new(
            lease.name().clone(),
            lease.owner(),
            fence,
            request.ttl(),
            lease.issued(),
        )
        .with_clock(lease.clock().clone())
        .with_access(access);
        self.real.lock().unwrap().insert(lease.owner(), lease);
        fake
    }

    fn real(&self, lease: &Lease) -> Lease {
        let real = self.real.lock().unwrap().get(&lease.owner()).cloned();
        real.unwrap_or_else(|| lease.clone())
    }
}

#[async_trait]
impl LockBackend for Broken {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        Ok(match self.store.try_acquire(&self.flawed(request)).await? {
            Attempt::Acquired(lease) => Attempt::Acquired(self.doctor(lease, request)),
            held => held,
        })
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let real: Vec<Lease> = leases.iter().map(|l| self.real(l)).collect();
        let renewed = self.store.renew_many(&real).await;
        (leases.iter().zip(renewed))
            .map(|(lease, answer)| answer.map(|r| lease.renewed(r.issued())))
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.store.release(&self.real(lease)).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.store.holders(name, kind).await
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.store.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.store.watch(name, kind).await
    }

    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let writes = request.access() == Some(Access::Write);
        if self.flaw == Flaw::NoWriterPreference {
            return wait::wait(wait, &mut Polling::new(self, request)).await;
        }
        if self.flaw == Flaw::LeaksWriterIntents && writes {
            let (store, leaked, mut long) = (self.store.clone(), request.clone(), wait.clone());
            long.deadline = Instant::now() + FOR_LONG;
            tokio::spawn(async move { store.acquire(&leaked, &long).await });
        }
        let granted = self.store.acquire(&self.flawed(request), wait).await?;
        Ok(granted.map(|lease| self.doctor(lease, request)))
    }

    async fn close(&self) -> Result<(), LockError> {
        self.store.close().await
    }
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
async fn writes_beside_readers_are_caught() {
    must_fail_saying(
        Flaw::SharedWrites,
        &[("rw_readers_share_writers_exclude", "a writer was granted")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_starved_by_readers_are_caught() {
    must_fail_saying(
        Flaw::NoWriterPreference,
        &[(
            "rw_waiting_writer_is_served_within_bound",
            "a writer waited",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_writer_intents_are_caught() {
    must_fail_saying(
        Flaw::LeaksWriterIntents,
        &[(
            "rw_writer_that_gave_up_leaves_nothing",
            "a writer that timed out still kept readers out",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeating_fences_are_caught() {
    must_fail_saying(
        Flaw::FenceRepeats,
        &[
            (
                "rw_fences_refuse_stale_holders",
                "a write granted after a read has fence",
            ),
            ("rw_readers_share_writers_exclude", "holders shows"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_that_never_expire_are_caught() {
    must_fail_saying(
        Flaw::NeverExpires,
        &[
            (
                "rw_crashed_holder_frees_the_name",
                "whose holder died still blocked",
            ),
            (
                "rw_fences_refuse_stale_holders",
                "stopped renewing still blocked",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_that_expire_early_are_caught() {
    must_fail_saying(
        Flaw::ExpiresEarly,
        &[
            (
                "rw_crashed_holder_frees_the_name",
                "before its holder's local deadline",
            ),
            (
                "rw_fences_refuse_stale_holders",
                "before its holder's local deadline",
            ),
        ],
    )
    .await;
}
