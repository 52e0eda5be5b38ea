//! `Cleanups`: the background work a client still owes the store, tracked
//! so that closing the client can finish it first.
//!
//! Some work cannot wait for the caller: undoing an acquire whose reply was
//! lost, leaving a line a cancelled waiter stood in, releasing a dropped
//! guard. It runs in the background. But a process that exits right after
//! (a CLI that timed out, a job runner on SIGTERM) would cut it short and
//! leave an entry that blocks others until its TTL. So every such task is
//! spawned through the client's `Cleanups`, and
//! [`LockBackend::close`](crate::LockBackend::close) and
//! [`Locker::close`](crate::Locker::close) wait for them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::{Backoff, LockError};

/// Background clean-ups of one client, tracked until they end.
#[derive(Clone, Default)]
pub struct Cleanups {
    tracker: TaskTracker,
}

impl Cleanups {
    /// No clean-ups yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `work` in the background on the current tokio runtime, tracked.
    /// Without a runtime nothing runs (returns `false`): what it would undo
    /// expires with its TTL.
    pub fn spawn<F>(&self, work: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.tracker.spawn_on(work, &runtime);
                true
            }
            Err(_) => false,
        }
    }

    /// Runs `cleanup` on `target` in the background (undoing an acquire whose
    /// reply was lost, leaving a line), retried with jittered backoff while it
    /// fails with a retryable error, until `until` (when whatever it would
    /// undo has expired anyway) or `target` is dropped. The first try holds
    /// `target`, later ones only if it is still alive. A permanent error is
    /// logged at DEBUG with `what`.
    pub fn retry<T, F, Fut>(&self, target: Arc<T>, until: Instant, what: &'static str, cleanup: F)
    where
        T: Send + Sync + 'static,
        F: FnMut(Arc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), LockError>> + Send + 'static,
    {
        self.spawn(retrying(target, until, what, cleanup));
    }

    /// How many clean-ups are still running.
    pub fn pending(&self) -> usize {
        self.tracker.len()
    }

    /// Waits until every clean-up spawned so far has ended, or `limit` has
    /// passed. Returns whether they all ended; those still running go on.
    pub async fn finish(&self, limit: Duration) -> bool {
        self.tracker.close();
        let done = tokio::time::timeout(limit, self.tracker.wait())
            .await
            .is_ok();
        self.tracker.reopen();
        done
    }
}

impl fmt::Debug for Cleanups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cleanups")
            .field("pending", &self.pending())
            .finish()
    }
}

async fn retrying<T, F, Fut>(target: Arc<T>, until: Instant, what: &'static str, mut cleanup: F)
where
    T: Send + Sync + 'static,
    F: FnMut(Arc<T>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), LockError>> + Send + 'static,
{
    let weak = Arc::downgrade(&target);
    let mut first = Some(target);
    let retry = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    for attempt in 0_u32.. {
        let Some(target) = first.take().or_else(|| weak.upgrade()) else {
            return;
        };
        match cleanup(target).await {
            Ok(()) => return,
            Err(e) if e.is_retryable() => {
                let next = Instant::now() + retry.delay(attempt);
                if next >= until {
                    return;
                }
                tokio::time::sleep_until(next).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "{what} failed; what it would undo expires");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn finish_waits_for_running_cleanups_and_retries() {
        let cleanups = Cleanups::new();
        let tries = Arc::new(AtomicU32::new(0));
        let target = Arc::new(());
        let counted = tries.clone();
        cleanups.retry(
            target.clone(),
            Instant::now() + Duration::from_secs(10),
            "test",
            move |_| {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 2 {
                        Err(LockError::unavailable("test", "not yet"))
                    } else {
                        Ok(())
                    }
                }
            },
        );
        assert_eq!(cleanups.pending(), 1);
        assert!(cleanups.finish(Duration::from_secs(5)).await);
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        assert_eq!(cleanups.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn finish_gives_up_at_its_limit() {
        let cleanups = Cleanups::new();
        cleanups.spawn(std::future::pending());
        assert!(!cleanups.finish(Duration::from_millis(100)).await);
        assert_eq!(cleanups.pending(), 1);
    }

    #[test]
    fn without_a_runtime_nothing_runs() {
        assert!(!Cleanups::new().spawn(async {}));
    }
}
