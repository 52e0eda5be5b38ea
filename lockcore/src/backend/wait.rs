//! Waiting for a lock: the one wait loop every backend uses.
//!
//! A backend describes one round of its wait as a [`Waiter`]: how to arm a
//! store wake-up before an attempt (pub/sub, LISTEN/NOTIFY, a watch), and
//! the attempt itself (a plain `try_acquire`, or "is it my turn?" in a queue
//! the store keeps). [`wait`] does the rest, the same way for every store:
//! counting attempts, the deadline, retrying right when the holder's lease
//! runs out ([`WaitPolicy::retry_at`]), sleeping on the wake-up bounded by the
//! re-check interval, and pausing with jittered backoff after a transient
//! error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

pub use crate::local_line::{LocalLine, LocalTurn};

use crate::lease::Lease;
use crate::outcome::Attempt;
use crate::{Backoff, LockError};

/// A future that completes when a lock name may have become free (release,
/// forced release or expiry). Registered before it is returned, so a change
/// that happens before the caller awaits it is not missed.
pub type Wakeup = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// How long and how an [`acquire`](crate::LockBackend::acquire) waits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WaitPolicy {
    /// Give up after this instant.
    pub deadline: Instant,
    /// Delays between attempts when the store does not notify (or failed).
    pub backoff: Backoff,
    /// With notifications, re-check at least this often anyway, so a lost
    /// notification costs latency, never liveness.
    pub recheck: Duration,
    attempts: Arc<AtomicU32>,
}

impl WaitPolicy {
    /// Wait until `deadline` with default backoff and a 1 s re-check.
    pub fn new(deadline: Instant) -> Self {
        WaitPolicy {
            deadline,
            backoff: Backoff::default(),
            recheck: Duration::from_secs(1),
            attempts: Arc::default(),
        }
    }

    /// Sets the backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets the re-check interval.
    pub fn recheck(mut self, recheck: Duration) -> Self {
        self.recheck = recheck;
        self
    }

    /// How many attempts waits under this policy (and its clones) made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// When to try again after attempt number `attempt` (from 1) found the
    /// lock held or failed. `expires_in` is the holder's remaining TTL if
    /// the store said: expiry sends no message on most stores, so the next
    /// try comes right after it. `notified`: a store wake-up is armed and the
    /// attempt did not fail, so the wait is bounded by `recheck`; otherwise
    /// by jittered backoff. Never past the deadline.
    pub fn retry_at(
        &self,
        now: Instant,
        attempt: u32,
        expires_in: Option<Duration>,
        notified: bool,
    ) -> Instant {
        let bound = if notified {
            self.recheck
        } else {
            self.backoff.delay(attempt.saturating_sub(1))
        };
        let at_expiry = expires_in.map(|d| d + Duration::from_millis(1));
        let pause = at_expiry.map_or(bound, |d| d.min(bound));
        (now + pause).min(self.deadline)
    }
}

/// One backend's steps in a wait, driven by [`wait`].
#[async_trait]
pub trait Waiter: Send {
    /// Arms a wake-up for the coming attempt, registered *before* it runs so
    /// a release in between is not missed. `None`: no store notification
    /// this round (the wait falls back to backoff). The default has none.
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        Ok(None)
    }

    /// One attempt (`attempt` counts from 1): the lease, or `Held` with the
    /// holder's remaining TTL where the store says it.
    async fn attempt(&mut self, attempt: u32) -> Result<Attempt, LockError>;
}

/// Waits until `waiter` gets the lock (`Some`) or `policy.deadline` passes
/// (`None`). A non-retryable error ends the wait at once; a retryable one
/// pauses with the policy's backoff and tries again, and is returned if the
/// deadline passes right after it.
///
/// # Cancel safety
/// Dropping the future stops waiting; the waiter's own `Drop` must remove
/// whatever place in line it holds.
pub async fn wait(
    policy: &WaitPolicy,
    waiter: &mut (dyn Waiter + '_),
) -> Result<Option<Lease>, LockError> {
    let mut attempt: u32 = 0;
    loop {
        let wakeup = match waiter.arm().await {
            Ok(wakeup) => wakeup,
            Err(e) if e.is_retryable() => {
                tracing::debug!(error = %e, "no wake-up for this round; backing off instead");
                None
            }
            Err(e) => return Err(e),
        };
        attempt = attempt.saturating_add(1);
        policy.attempts.fetch_add(1, Ordering::Relaxed);
        tracing::Span::current().record("attempts", attempt);
        let (expires_in, failed) = match waiter.attempt(attempt).await {
            Ok(Attempt::Acquired(lease)) => return Ok(Some(lease)),
            Ok(Attempt::Held { expires_in }) => (expires_in, None),
            Err(e) if e.is_retryable() => {
                tracing::debug!(attempt, error = %e, "acquire attempt failed, will retry");
                (None, Some(e))
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        if now >= policy.deadline {
            return failed.map_or(Ok(None), Err);
        }
        let notified = wakeup.is_some() && failed.is_none();
        let until = policy.retry_at(now, attempt, expires_in, notified);
        match wakeup {
            Some(wakeup) if failed.is_none() => {
                tokio::select! {
                    _ = wakeup => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
            _ => tokio::time::sleep_until(until).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scripted attempts: held (with a TTL left), failing, then granted.
    struct Script {
        steps: Vec<Result<Attempt, LockError>>,
        armed: usize,
    }

    #[async_trait]
    impl Waiter for Script {
        async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
            // A store wake-up that never comes.
            self.armed += 1;
            Ok(Some(Box::pin(std::future::pending())))
        }
        async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
            self.steps.remove(0)
        }
    }

    fn lease() -> Lease {
        let caps = crate::Capabilities::new("test");
        Lease::new(
            crate::LockName::new("n").unwrap(),
            crate::OwnerToken::new(),
            crate::FencingToken::new(1).unwrap(),
            caps.effective_ttl(Duration::from_secs(1)).unwrap(),
            crate::backend::Moment::now(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn retries_at_the_holders_expiry_and_through_transient_errors() {
        let started = Instant::now();
        let policy = WaitPolicy::new(started + Duration::from_secs(60))
            .backoff(Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(10),
            ))
            .recheck(Duration::from_secs(30));
        let mut script = Script {
            steps: vec![
                Ok(Attempt::Held {
                    expires_in: Some(Duration::from_secs(5)),
                }),
                Err(LockError::unavailable("test", "reset")),
                Ok(Attempt::Acquired(lease())),
            ],
            armed: 0,
        };
        let got = wait(&policy, &mut script).await.unwrap();
        assert!(got.is_some());
        assert_eq!(policy.attempts(), 3);
        assert_eq!(script.armed, 3);
        let waited = started.elapsed();
        // Exactly the holder's expiry (+1 ms), not the 30 s re-check, then
        // at most 10 ms of backoff after the transient error.
        assert!(
            waited >= Duration::from_millis(5_001) && waited <= Duration::from_millis(5_011),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_deadline_and_stops_on_permanent_errors() {
        let policy = WaitPolicy::new(Instant::now() + Duration::from_secs(2));
        let mut held = Script {
            steps: (0..1000)
                .map(|_| Ok(Attempt::Held { expires_in: None }))
                .collect(),
            armed: 0,
        };
        assert!(wait(&policy, &mut held).await.unwrap().is_none());
        let mut refused = Script {
            steps: vec![Err(LockError::store("test", "denied"))],
            armed: 0,
        };
        assert!(matches!(
            wait(&policy, &mut refused).await,
            Err(LockError::Store { .. })
        ));
    }
}
