//! Metrics, emitted once here for every backend through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`): the application installs the exporter it
//! wants (Prometheus, OpenTelemetry, StatsD...). Without the feature every
//! function here compiles to nothing.
//!
//! Every metric carries the label `backend` (`"redis"`, `"postgres"`...).
//! Lock names are not labels unless a locker opts in with
//! [`Locker::name_in_metrics`](crate::Locker::name_in_metrics): do that only
//! for a small, bounded set of names.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `distlock_acquire_wait_seconds` | histogram | `outcome`: acquired, timed_out, cancelled, error |
//! | `distlock_acquire_attempts` | histogram | `outcome` |
//! | `distlock_contended_attempts_total` | counter | |
//! | `distlock_hold_seconds` | histogram | |
//! | `distlock_renewal_seconds` | histogram | (one batch) |
//! | `distlock_renewal_failures_total` | counter | `kind`: refused, unavailable, error |
//! | `distlock_leases_lost_total` | counter | `reason`: renewal_refused, renewal_unanswered, deadline_passed, store_reported, renewal_failed, max_hold_exceeded |
//! | `distlock_long_holds_total` | counter | |
//! | `distlock_forced_releases_total` | counter | `outcome`: evicted, nothing_evicted, unknown |
//! | `distlock_locks_held` | gauge | |
//! | `distlock_waiters` | gauge | |
//! | `distlock_store_errors_total` | counter | `retryable`: true, false |

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::wait::WaitPolicy;
use crate::{LockError, LockName, LossReason};

/// Who a measurement is about: the backend, and the lock name when the
/// locker opted in.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Tags {
    backend: &'static str,
    name: Option<LockName>,
}

impl Tags {
    pub(crate) fn new(backend: &'static str, name: Option<&LockName>) -> Tags {
        Tags {
            backend,
            name: name.cloned(),
        }
    }

    #[cfg(feature = "metrics")]
    fn labels(&self, extra: &[(&'static str, &'static str)]) -> Vec<::metrics::Label> {
        let mut labels = vec![::metrics::Label::new("backend", self.backend)];
        if let Some(name) = &self.name {
            labels.push(::metrics::Label::new("name", name.as_str().to_owned()));
        }
        labels.extend(extra.iter().map(|(k, v)| ::metrics::Label::new(*k, *v)));
        labels
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WaitOutcome {
    Acquired,
    TimedOut,
    Cancelled,
    Error,
}

impl WaitOutcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            WaitOutcome::Acquired => "acquired",
            WaitOutcome::TimedOut => "timed_out",
            WaitOutcome::Cancelled => "cancelled",
            WaitOutcome::Error => "error",
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn reason_label(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::RenewalRefused => "renewal_refused",
        LossReason::RenewalUnanswered => "renewal_unanswered",
        LossReason::DeadlinePassed => "deadline_passed",
        LossReason::StoreReported => "store_reported",
        LossReason::RenewalFailed(_) => "renewal_failed",
        LossReason::MaxHoldExceeded => "max_hold_exceeded",
        LossReason::Closed => "closed",
    }
}

/// A wait started: counts as a waiter until it ends.
pub(crate) fn wait_started(tags: &Tags) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!("distlock_waiters", tags.labels(&[])).increment(1.0);
    let _ = tags;
}

/// A wait ended after `waited` and `attempts` attempts.
pub(crate) fn wait_ended(tags: &Tags, outcome: WaitOutcome, waited: Duration, attempts: u32) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::gauge!("distlock_waiters", tags.labels(&[])).decrement(1.0);
        let labels = tags.labels(&[("outcome", outcome.as_str())]);
        ::metrics::histogram!("distlock_acquire_wait_seconds", labels.clone())
            .record(waited.as_secs_f64());
        ::metrics::histogram!("distlock_acquire_attempts", labels).record(f64::from(attempts));
        let contended = match outcome {
            WaitOutcome::Acquired => attempts.saturating_sub(1),
            _ => attempts,
        };
        if contended > 0 {
            ::metrics::counter!("distlock_contended_attempts_total", tags.labels(&[]))
                .increment(u64::from(contended));
        }
    }
    let _ = (tags, outcome, waited, attempts);
}

/// One attempt found the lock held.
pub(crate) fn contended(tags: &Tags) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("distlock_contended_attempts_total", tags.labels(&[])).increment(1);
    let _ = tags;
}

/// A guard started holding.
pub(crate) fn hold_started(tags: &Tags) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!("distlock_locks_held", tags.labels(&[])).increment(1.0);
    let _ = tags;
}

/// A guard stopped holding (released, dropped or lost) after `held`.
pub(crate) fn hold_ended(tags: &Tags, held: Duration) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::gauge!("distlock_locks_held", tags.labels(&[])).decrement(1.0);
        ::metrics::histogram!("distlock_hold_seconds", tags.labels(&[])).record(held.as_secs_f64());
    }
    let _ = (tags, held);
}

/// A lease was lost.
pub(crate) fn lost(tags: &Tags, reason: &LossReason) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        "distlock_leases_lost_total",
        tags.labels(&[("reason", reason_label(reason))])
    )
    .increment(1);
    let _ = (tags, reason);
}

/// A guard passed the long-hold threshold.
pub(crate) fn long_hold(tags: &Tags) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("distlock_long_holds_total", tags.labels(&[])).increment(1);
    let _ = tags;
}

/// One batch of renewals took `took`.
pub(crate) fn renewal_batch(backend: &'static str, took: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!("distlock_renewal_seconds", "backend" => backend)
        .record(took.as_secs_f64());
    let _ = (backend, took);
}

/// A renewal failed with `error`.
pub(crate) fn renewal_failed(tags: &Tags, error: &LockError) {
    #[cfg(feature = "metrics")]
    {
        let kind = match error {
            LockError::NotHeld { .. } => "refused",
            e if e.is_retryable() => "unavailable",
            _ => "error",
        };
        ::metrics::counter!(
            "distlock_renewal_failures_total",
            tags.labels(&[("kind", kind)])
        )
        .increment(1);
    }
    store_error(tags, error);
}

/// A forced release ended: `Some(true)` evicted, `Some(false)` nothing to
/// evict, `None` unknown.
pub(crate) fn forced_release(tags: &Tags, evicted: Option<bool>) {
    #[cfg(feature = "metrics")]
    {
        let outcome = match evicted {
            Some(true) => "evicted",
            Some(false) => "nothing_evicted",
            None => "unknown",
        };
        ::metrics::counter!(
            "distlock_forced_releases_total",
            tags.labels(&[("outcome", outcome)])
        )
        .increment(1);
    }
    let _ = (tags, evicted);
}

/// Counts `error` if it came from the store (not bad input, not a lost lease).
pub(crate) fn store_error(tags: &Tags, error: &LockError) {
    #[cfg(feature = "metrics")]
    if matches!(
        error,
        LockError::Unavailable { .. } | LockError::Store { .. }
    ) {
        let retryable = if error.is_retryable() {
            "true"
        } else {
            "false"
        };
        ::metrics::counter!(
            "distlock_store_errors_total",
            tags.labels(&[("retryable", retryable)])
        )
        .increment(1);
    }
    let _ = (tags, error);
}

/// One wait, measured: counted as a waiter until it ends; a wait dropped
/// before it ends (a cancelled acquire) counts as cancelled.
pub(crate) struct MeasuredWait<'a> {
    pub(crate) tags: Tags,
    policy: &'a WaitPolicy,
    started: Instant,
    ended: bool,
}

impl<'a> MeasuredWait<'a> {
    pub(crate) fn start(tags: Tags, policy: &'a WaitPolicy) -> Self {
        wait_started(&tags);
        MeasuredWait {
            tags,
            policy,
            started: Instant::now(),
            ended: false,
        }
    }

    pub(crate) fn end(&mut self, outcome: WaitOutcome) {
        if !self.ended {
            self.ended = true;
            wait_ended(
                &self.tags,
                outcome,
                self.started.elapsed(),
                self.policy.attempts(),
            );
        }
    }
}

impl Drop for MeasuredWait<'_> {
    fn drop(&mut self) {
        self.end(WaitOutcome::Cancelled);
    }
}
