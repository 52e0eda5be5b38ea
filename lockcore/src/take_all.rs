//! How a [`Locker`] takes several locks together (`acquire_all`): in one
//! atomic store operation per attempt where the backend can
//! ([`Capabilities::atomic_multi`](crate::Capabilities::atomic_multi)),
//! else one by one in sorted order. Either way every name or none, under
//! one deadline, and no two callers ever wait on each other in a cycle.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::wait::{self, Waiter, Wakeup};
use crate::backend::{Kind, LockRequest};
use crate::locker::Ask;
use crate::metrics::{self, MeasuredWait, WaitOutcome};
use crate::{
    Attempt, AttemptEach, IntoLockName, Lease, LockBackend, LockError, LockGuard, LockName, Locker,
    MultiGuard,
};

impl Locker {
    /// Waits up to the configured max wait for every lock of `names`: all
    /// of them or none, under one deadline (see [`MultiGuard`]).
    ///
    /// Where the backend takes several locks in one atomic operation
    /// ([`Capabilities::atomic_multi`](crate::Capabilities::atomic_multi)),
    /// each attempt takes every name or none, and the wait holds none of
    /// them: it retries when the name it found held may have become free. Elsewhere
    /// the names are taken one by one in sorted order, whatever order they
    /// are given in (what was taken is held while the rest is waited for).
    /// Either way, callers asking for the same names never deadlock.
    ///
    /// # Errors
    /// [`LockError::Timeout`] naming a lock still held when the wait ran
    /// out; [`LockError::InvalidConfig`] for no names or a name given
    /// twice, and an invalid name, TTL or configuration, before any I/O; a
    /// store error. Whatever was taken is released before it returns.
    ///
    /// # Cancel safety
    /// Dropping the future drops the guards it took, which release in the
    /// background (or expire after one TTL); an attempt in flight is as in
    /// [`acquire`](Self::acquire).
    pub async fn acquire_all<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
    ) -> Result<MultiGuard, LockError> {
        self.acquire_all_timeout(names, self.get_max_wait()).await
    }

    /// Like [`acquire_all`](Self::acquire_all) with an explicit wait.
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all); [`LockError::InvalidTimeout`]
    /// for a wait above [`MAX_WAIT`](Self::MAX_WAIT).
    pub async fn acquire_all_timeout<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
        wait: Duration,
    ) -> Result<MultiGuard, LockError> {
        let requests = self.multi_requests(names)?;
        Self::check_wait(wait)?;
        let started = Instant::now();
        if self.backend().capabilities().atomic_multi {
            match self.all_at_once(&requests, started + wait).await {
                Err(e) if is_not_kept(&e) => {}
                taken => return taken,
            }
        }
        let mut taken = Vec::with_capacity(requests.len());
        for request in requests {
            let left = (started + wait).saturating_duration_since(Instant::now());
            match self.take(request.name().clone(), left, Ask::Lock).await {
                Ok(guard) => taken.push(guard),
                Err(e) => {
                    give_back(taken).await;
                    return Err(match e {
                        LockError::Timeout { name, .. } => LockError::Timeout {
                            name,
                            waited: started.elapsed(),
                        },
                        e => e,
                    });
                }
            }
        }
        Ok(MultiGuard::new(taken))
    }

    /// One attempt at every lock of `names`: all of them, or `Ok(None)` and
    /// none (in one atomic store operation where the backend can; else what
    /// was taken before a held name is released first).
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all), without the timeout.
    pub async fn try_acquire_all<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
    ) -> Result<Option<MultiGuard>, LockError> {
        let requests = self.multi_requests(names)?;
        if self.backend().capabilities().atomic_multi {
            let policy = self.hold_policy(requests[0].name(), requests[0].ttl())?;
            match self.backend().try_acquire_each(&requests).await {
                Ok(AttemptEach::Acquired(leases)) => return Ok(Some(self.guards(leases, policy))),
                Ok(AttemptEach::Held { name, .. }) => {
                    metrics::contended(&self.tags(&name));
                    return Ok(None);
                }
                Err(e) if is_not_kept(&e) => {}
                Err(e) => {
                    metrics::store_error(&self.tags(requests[0].name()), &e);
                    return Err(e);
                }
            }
        }
        let mut taken = Vec::with_capacity(requests.len());
        for request in requests {
            match self.try_take(request.name().clone(), Ask::Lock).await {
                Ok(Some(guard)) => taken.push(guard),
                outcome => {
                    give_back(taken).await;
                    return outcome.map(|_| None);
                }
            }
        }
        Ok(Some(MultiGuard::new(taken)))
    }

    /// Waits until `deadline` for every lock of `requests` through the one
    /// wait loop, each attempt one atomic operation.
    async fn all_at_once(
        &self,
        requests: &[LockRequest],
        deadline: Instant,
    ) -> Result<MultiGuard, LockError> {
        let started = Instant::now();
        let policy = self.hold_policy(requests[0].name(), requests[0].ttl())?;
        let waiting = self.wait_policy(deadline);
        let mut measured = MeasuredWait::start(self.tags(requests[0].name()), &waiting);
        let mut waiter = AllAtOnce {
            backend: self.backend().as_ref(),
            requests,
            held: None,
            granted: None,
        };
        let outcome = wait::wait(&waiting, &mut waiter).await;
        match (outcome, waiter.granted) {
            (Ok(Some(_)), Some(leases)) => {
                measured.end(WaitOutcome::Acquired);
                Ok(self.guards(leases, policy))
            }
            (Ok(_), _) => {
                measured.end(WaitOutcome::TimedOut);
                Err(LockError::Timeout {
                    name: waiter.held.unwrap_or_else(|| requests[0].name().clone()),
                    waited: started.elapsed(),
                })
            }
            (Err(e), _) => {
                metrics::store_error(&measured.tags, &e);
                measured.end(WaitOutcome::Error);
                Err(e)
            }
        }
    }

    fn guards(&self, leases: Vec<Lease>, policy: crate::renewer::HoldPolicy) -> MultiGuard {
        MultiGuard::new(leases.into_iter().map(|l| self.guard(l, policy)).collect())
    }

    /// The requests of a multi-lock, one per name in the order they are
    /// taken (sorted), checked before any I/O.
    fn multi_requests<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
    ) -> Result<Vec<LockRequest>, LockError> {
        let mut names = names
            .into_iter()
            .map(IntoLockName::into_lock_name)
            .collect::<Result<Vec<_>, _>>()?;
        names.sort();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(LockError::config(format!(
                "lock \"{}\" is named twice: a multi-lock takes each name once",
                twice[0]
            )));
        }
        let Some(first) = names.first() else {
            return Err(LockError::config("a multi-lock needs at least one name"));
        };
        let request = self.request(first.clone(), Ask::Lock)?;
        self.hold_policy(first, request.ttl())?;
        names
            .into_iter()
            .map(|name| self.request(name, Ask::Lock))
            .collect()
    }
}

/// The waiter of an atomic multi-lock: each attempt every name or none,
/// armed on the wake-up of the name the last attempt found held (a free
/// name's wake-up may fire at once: armed on every name, the wait would
/// spin). The wait loop returns its first lease; the waiter keeps them all.
struct AllAtOnce<'a> {
    backend: &'a dyn LockBackend,
    requests: &'a [LockRequest],
    /// The name the last attempt found held.
    held: Option<LockName>,
    granted: Option<Vec<Lease>>,
}

#[async_trait]
impl Waiter for AllAtOnce<'_> {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        match &self.held {
            Some(name) if self.backend.capabilities().notifications => {
                self.backend.watch(name, Kind::Lock).await
            }
            _ => Ok(None),
        }
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        match self.backend.try_acquire_each(self.requests).await? {
            AttemptEach::Acquired(leases) => {
                let Some(first) = leases.first().cloned() else {
                    return Err(LockError::store(
                        self.backend.capabilities().backend,
                        "try_acquire_each granted no lease",
                    ));
                };
                self.granted = Some(leases);
                Ok(Attempt::Acquired(first))
            }
            AttemptEach::Held { name, expires_in } => {
                self.held = Some(name);
                Ok(Attempt::Held { expires_in })
            }
        }
    }
}

/// Whether `e` says the backend has no atomic multi-lock attempt after all
/// (a wrapper that passes on another backend's capabilities but not this
/// method): the names are then taken one by one.
fn is_not_kept(e: &LockError) -> bool {
    matches!(
        e,
        LockError::Unsupported {
            operation: "try_acquire_each",
            ..
        }
    )
}

/// Releases what a multi-lock took before it failed (each release's
/// failure is logged by the guard; the lease then expires after its TTL).
async fn give_back(taken: Vec<LockGuard>) {
    for guard in taken {
        let _ = guard.release().await;
    }
}
