//! The guard's loss signal, `with_lock`, and release on drop.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{LockError, Locker, LossReason, ReleaseOutcome};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure};

/// When an admin force-releases a held lock, the holder's guard learns:
/// `lost()` fires and `is_held()` turns false, within the backend's declared
/// eviction notice (plus a round trip) where the store pushes it, else at its
/// next renewal.
pub async fn lost_fires_on_force_release(cx: &Ctx) -> CaseResult {
    let (a, admin) = (cx.client().await?, cx.client().await?);
    let name = cx.name("evicted");
    let ttl = cx.short_ttl().max(cx.scaled(Duration::from_secs(2)));
    let ttl = cx.caps().effective_ttl(ttl).map_or(ttl, |t| t.get());
    let every = ttl / 4;
    let guard = cx.locker(&a, ttl).renew_every(every).acquire(&name).await?;
    ensure!(guard.is_held(), "a fresh guard must be held");
    let (bound, promise) = heard_within(cx, ttl, every);
    Locker::from_arc(admin)
        .force_release(&name, "conformance: evict holder")
        .await?;
    let evicted = Instant::now();
    let reason = tokio::time::timeout(bound, guard.lost())
        .await
        .map_err(|_| {
            Failure::new(format!(
                "lost() did not fire within {bound:?} ({promise}) of a forced release"
            ))
        })?;
    ensure!(
        matches!(
            reason,
            LossReason::RenewalRefused | LossReason::StoreReported
        ),
        "unexpected loss reason {reason:?}"
    );
    ensure!(!guard.is_held(), "is_held() must be false once lost");
    ensure!(
        matches!(guard.ensure_held(), Err(LockError::Lost { .. })),
        "ensure_held() must fail once lost"
    );
    ensure!(
        evicted.elapsed() <= bound,
        "loss noticed after {:?}, later than {bound:?} ({promise})",
        evicted.elapsed()
    );
    let outcome = guard.release().await?;
    ensure!(
        outcome == ReleaseOutcome::NotHeld,
        "releasing a lost lease must report NotHeld, got {outcome:?}"
    );
    Ok(Outcome::Passed)
}

/// How soon a holder of a `ttl` lease renewed `every` hears of a forced
/// release: the declared eviction notice and a round trip, or without one,
/// its next renewal (and slack); with the promise in words.
pub(crate) fn heard_within(cx: &Ctx, ttl: Duration, every: Duration) -> (Duration, String) {
    match cx.caps().eviction_notice {
        Some(notice) => (
            notice + cx.round_trip(),
            format!("the declared eviction notice {notice:?} + a round trip"),
        ),
        None => (
            every + cx.slack(ttl),
            "one renew interval + slack".to_owned(),
        ),
    }
}

/// Without renewal, the guard counts the lock lost exactly at its local
/// deadline: not before, and promptly after.
pub async fn lost_fires_at_the_deadline(cx: &Ctx) -> CaseResult {
    let a = cx.client().await?;
    let name = cx.name("deadline");
    let guard = cx
        .locker(&a, cx.short_ttl())
        .auto_renew(false)
        .acquire(&name)
        .await?;
    let deadline = guard.lease().deadline();
    let reason = tokio::time::timeout(cx.short_ttl() + cx.slack(cx.short_ttl()), guard.lost())
        .await
        .map_err(|_| Failure::new("lost() did not fire after the deadline"))?;
    let fired = Instant::now();
    ensure!(
        fired >= deadline,
        "lost() fired {:?} before the deadline",
        deadline - fired
    );
    ensure!(
        reason == LossReason::DeadlinePassed,
        "unexpected loss reason {reason:?}"
    );
    ensure!(
        !guard.is_held(),
        "is_held() must be false after the deadline"
    );
    drop(guard);
    Ok(Outcome::Passed)
}

/// `with_lock` stops the critical section the moment the lease is lost and
/// returns `Lost`.
pub async fn with_lock_stops_when_lost(cx: &Ctx) -> CaseResult {
    let (a, admin) = (cx.client().await?, cx.client().await?);
    let name = cx.name("critical");
    let ttl = cx
        .caps()
        .effective_ttl(cx.short_ttl().max(cx.scaled(Duration::from_secs(2))))
        .map_or(cx.short_ttl(), |t| t.get());
    let every = ttl / 4;
    let locker = cx.locker(&a, ttl).renew_every(every);
    let entered = Arc::new(Notify::new());
    let mut evictor = {
        let (name, entered) = (name.clone(), entered.clone());
        tokio::spawn(async move {
            // Once the critical section runs, the lock held.
            entered.notified().await;
            let evicted = Instant::now();
            Locker::from_arc(admin)
                .force_release(&name, "conformance: stop the critical section")
                .await
                .map(|_| evicted)
        })
    };
    let run = locker.with_lock(&name, |_fence| {
        entered.notify_one();
        std::future::pending::<()>()
    });
    tokio::pin!(run);
    // The section must end by itself: bounded from the eviction on, so a
    // backend that never tells its holder fails here instead of hanging.
    let (outcome, stopped, evicted) = tokio::select! {
        outcome = &mut run => {
            let stopped = Instant::now();
            if !matches!(outcome, Err(LockError::Lost { .. })) {
                evictor.abort();
                return Err(Failure::new(format!("expected Lost, got {outcome:?}")));
            }
            // The holder may hear before the eviction call returns.
            let evicted = (&mut evictor)
                .await
                .map_err(|e| Failure::new(format!("evictor failed: {e}")))??;
            (outcome, stopped, evicted)
        }
        evicted = &mut evictor => {
            let evicted = evicted.map_err(|e| Failure::new(format!("evictor failed: {e}")))??;
            match tokio::time::timeout_at(evicted + every + cx.slack(ttl), &mut run).await {
                Ok(outcome) => (outcome, Instant::now(), evicted),
                Err(_) => {
                    return Err(Failure::new(format!(
                        "the critical section still ran {:?} after the eviction",
                        evicted.elapsed()
                    )));
                }
            }
        }
    };
    ensure!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "expected Lost, got {outcome:?}"
    );
    ensure!(
        stopped <= evicted + every + cx.slack(ttl),
        "the critical section ran {:?} after the eviction",
        stopped - evicted
    );
    Ok(Outcome::Passed)
}

/// Dropping a guard releases the lock in the background, long before its TTL.
pub async fn guard_drop_releases(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("dropped");
    let guard = cx.locker(&a, cx.long_ttl()).acquire(&name).await?;
    let fence = guard.fencing_token();
    drop(guard);
    let next = cx
        .eventually(
            cx.slack(Duration::ZERO),
            "acquisition after the guard was dropped",
            || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
        )
        .await?;
    ensure!(next.fence() > fence, "fence must grow");
    ensure!(
        b.release(&next).await? == ReleaseOutcome::Released,
        "release should succeed"
    );
    Ok(Outcome::Passed)
}
