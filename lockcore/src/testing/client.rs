//! `TestBackend`: one client of a [`TestStore`](super::TestStore), the
//! [`LockBackend`] an application under test is given. Each call meets the
//! faults of its scopes, then the store, then the reply delay; what the
//! store did goes into the history.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;

use super::faults::{BACKEND, Faults, RenewalAction};
use super::history::{Change, History};
use crate::backend::wait::{self, WaitPolicy, Wakeup};
use crate::backend::{Kind, LockRequest, Polling, Ttl};
use crate::clock::{Clock, Moment};
use crate::request::Access;
use crate::{
    Attempt, AttemptEach, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError,
    LockName, MemoryBackend, ReleaseOutcome,
};

/// A client of a [`TestStore`](super::TestStore) (made by
/// [`TestStore::client`](super::TestStore::client)): a [`LockBackend`] for a
/// [`Locker`](crate::Locker), with faults of its own.
pub struct TestBackend {
    inner: MemoryBackend,
    /// This client's faults, then the store's.
    scopes: [Faults; 2],
    history: History,
}

impl TestBackend {
    pub(super) fn new(inner: MemoryBackend, store_faults: Faults, history: History) -> Self {
        TestBackend {
            inner,
            scopes: [Faults::default(), store_faults],
            history,
        }
    }

    /// The faults of this client alone (the store's apply too). Take it
    /// before handing the client to a [`Locker`](crate::Locker).
    pub fn faults(&self) -> Faults {
        self.scopes[0].clone()
    }

    /// An error if this client cannot reach the store.
    fn reach(&self) -> Result<(), LockError> {
        self.scopes.iter().try_for_each(Faults::reach)
    }

    /// Holds `answer` back by the longer of the scopes' delays.
    async fn reply<T>(&self, answer: T) -> T {
        let delay = self
            .scopes
            .iter()
            .map(Faults::delay)
            .max()
            .unwrap_or_default();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        answer
    }
}

/// Tokio's clock alone, for the leases a test store hands out: under a
/// paused clock their deadlines move only as the test's time does. (The
/// real clocks also read the host's boot clock, which runs on in real time
/// however the test's clock stands.)
#[derive(Debug)]
struct TestClock;

impl Clock for TestClock {
    fn now(&self) -> Moment {
        Moment::from_parts(Instant::now(), None)
    }
}

/// `lease` judged on the test's clock, from the same send time.
fn on_test_clock(lease: Lease) -> Lease {
    let sent = Moment::from_parts(lease.issued().mono(), None);
    lease.with_clock(Arc::new(TestClock)).renewed(sent)
}

impl fmt::Debug for TestBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestBackend")
            .field("store", &self.inner)
            .field("faults", &self.scopes[0])
            .field("store_faults", &self.scopes[1])
            .finish()
    }
}

#[async_trait]
impl LockBackend for TestBackend {
    /// The in-memory store's, under the name `"test"`.
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.inner.capabilities();
        capabilities.backend = BACKEND;
        capabilities
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.reach()?;
        let at = Instant::now();
        let attempt = match self.inner.try_acquire(request).await {
            Ok(Attempt::Acquired(lease)) => {
                self.history.granted(&lease, request.label(), at);
                Ok(Attempt::Acquired(on_test_clock(lease)))
            }
            other => other,
        };
        self.reply(attempt).await
    }

    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        self.reach()?;
        let at = Instant::now();
        let attempt = match self.inner.try_acquire_each(requests).await {
            Ok(AttemptEach::Acquired(leases)) => Ok(AttemptEach::Acquired(
                leases
                    .into_iter()
                    .zip(requests)
                    .map(|(lease, request)| {
                        self.history.granted(&lease, request.label(), at);
                        on_test_clock(lease)
                    })
                    .collect(),
            )),
            other => other,
        };
        self.reply(attempt).await
    }

    /// The one wait loop over this client's attempts; a writer waiting for
    /// a reader-writer lock keeps its intent in the store while it waits,
    /// as the in-memory store's own wait does.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let _intent = match request.access() {
            Some(Access::Write) => Some(self.inner.writer_waits(request.name())?),
            _ => None,
        };
        wait::wait(wait, &mut Polling::new(self, request)).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let fail = |e: LockError| leases.iter().map(|_| Err(e.clone())).collect();
        if let Err(e) = self.reach() {
            return fail(e);
        }
        // Every scope counts the call, so each `fail_renewals(n)` is used up
        // by its own n calls.
        let actions = self.scopes.each_ref().map(Faults::next_renewal);
        if actions.contains(&RenewalAction::Fail) {
            return fail(LockError::unavailable(
                BACKEND,
                "renewal failed by the test",
            ));
        }
        for (scope, action) in self.scopes.iter().zip(actions) {
            if action == RenewalAction::Hang {
                scope.unhung().await;
            }
        }
        // A partition may have begun while the call hung.
        if let Err(e) = self.reach() {
            return fail(e);
        }
        let at = Instant::now();
        let renewed = self.inner.renew_many(leases).await;
        for lease in renewed.iter().flatten() {
            self.history.renewed(lease, at);
        }
        self.reply(renewed).await
    }

    /// Meets this client's faults like a renewal (a failed or hung
    /// renewal fails or hangs it too), then the store's.
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        let mut answer = self.renew_many(&[lease.clone().with_ttl(remaining)]).await;
        answer
            .pop()
            .unwrap_or_else(|| Err(LockError::store(BACKEND, "set_remaining answered nothing")))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.reach()?;
        let at = Instant::now();
        let outcome = self.inner.release(lease).await;
        if let Ok(ReleaseOutcome::Released) = outcome {
            self.history
                .ended(Some(lease.owner()), Change::Released, at);
        }
        self.reply(outcome).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.reach()?;
        let holders = self.inner.holders(name, kind).await;
        self.reply(holders).await
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.reach()?;
        let at = Instant::now();
        let evicted = self.inner.evict(name, expected).await;
        if let Ok(holder) = &evicted {
            self.history
                .holder_ended(holder.as_ref(), Change::Evicted, at);
        }
        self.reply(evicted).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.reach()?;
        let wakeup = self.inner.watch(name, kind).await;
        self.reply(wakeup).await
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.reach()?;
        let raised = self.inner.raise_fence_floor(floor).await;
        self.reply(raised).await
    }

    /// Closes this client (its grants' loss signals fire), faults or not.
    async fn close(&self) -> Result<(), LockError> {
        self.inner.close().await
    }
}
