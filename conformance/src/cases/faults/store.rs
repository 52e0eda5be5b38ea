//! T3.6, T3.7: the store killed and restarted, or paused.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, FenceDurability, FencedResource, LockBackend, ReleaseOutcome};
use tokio::time::Instant;

use crate::history::History;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

use super::support::{check_history, fault_ttl, stale_write_refused, timer_slack};

/// T3.6: the store is killed with `kill -9` and restarted on the same
/// data, in its durable configuration. The first fence after the restart
/// is above the last one before it (F2), and a lock held at the crash is
/// either still held or re-granted with a larger fence.
pub async fn fences_survive_store_crash(cx: &Ctx) -> CaseResult {
    if matches!(cx.caps().fence_durability, FenceDurability::Volatile) {
        skip!("the backend declares volatile fences (FenceDurability::Volatile)");
    }
    let (private, store) = match cx.private_store().await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    if !store.durable() {
        skip!("the private store is not in its durable configuration (StoreControl::durable)");
    }
    let c = cx.private_client(&private).await?;
    let name = cx.name("crash");
    let held_name = cx.name("crash-held");
    let mut last = None;
    for round in 0..50 {
        let lease = cx.must_acquire(&c, &name, cx.long_ttl()).await?;
        if let Some(prev) = last {
            ensure!(
                lease.fence() > prev,
                "round {round}: fence {} not above {prev}",
                lease.fence()
            );
        }
        last = Some(lease.fence());
        c.release(&lease).await?;
    }
    let last = last.ok_or_else(|| Failure::new("no grant before the crash"))?;
    let held = cx.must_acquire(&c, &held_name, cx.long_ttl()).await?;

    store
        .kill()
        .await
        .map_err(|e| Failure::new(format!("kill -9 failed: {e}")))?;
    store
        .restart()
        .await
        .map_err(|e| Failure::new(format!("restart failed: {e}")))?;
    let fresh = private
        .client()
        .await
        .map_err(|e| Failure::new(format!("cannot connect after the restart: {e}")))?;
    let first = cx
        .eventually(
            cx.slack(Duration::ZERO) * 5,
            "the first grant after the restart",
            || async {
                match fresh.try_acquire_for(&name, cx.long_ttl()).await {
                    Ok(attempt) => Ok(attempt.into_lease()),
                    Err(e) if e.is_retryable() => Ok(None),
                    Err(e) => Err(e.into()),
                }
            },
        )
        .await?;
    ensure!(
        first.fence() > last,
        "F2: first fence after kill -9 + restart is {}, not above the last before, {last}",
        first.fence()
    );
    fresh.release(&first).await?;
    let mut prev = first.fence();
    for round in 0..10 {
        let lease = cx.must_acquire(&fresh, &name, cx.long_ttl()).await?;
        ensure!(
            lease.fence() > prev,
            "round {round} after restart: fence {} not above {prev}",
            lease.fence()
        );
        prev = lease.fence();
        fresh.release(&lease).await?;
    }
    match fresh.try_acquire_for(&held_name, cx.long_ttl()).await? {
        Attempt::Held { .. } => {}
        Attempt::Acquired(lease) => {
            ensure!(
                lease.fence() > held.fence(),
                "F2: the lock held at the crash was re-granted with fence {}, not above {}",
                lease.fence(),
                held.fence()
            );
            fresh.release(&lease).await?;
        }
    }
    Ok(Outcome::Passed)
}

/// T3.7: the store is stopped (`SIGSTOP`) for longer than the TTL while
/// a holder renews and a waiter waits, then resumed. The holder's
/// `lost()` fires by its deadline; once resumed the waiter gets the lock
/// within TTL + slack, after the holder's deadline, with a larger fence;
/// the old holder's fenced write is refused.
pub async fn store_pause_keeps_invariants(cx: &Ctx) -> CaseResult {
    let (private, store) = match cx.private_store().await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let a = cx.private_client(&private).await?;
    let b = cx.private_client(&private).await?;
    let name = cx.name("store-paused");
    let ttl = fault_ttl(cx);
    let history = Arc::new(History::new());
    let resource = FencedResource::new(Vec::new());

    let invoked = Instant::now();
    let guard = cx.locker(&a, ttl).acquire(&name).await?;
    let fence_a = guard.fencing_token();
    let grant_a = history.granted(0, &name, fence_a, invoked);
    resource
        .write(fence_a, |v| v.push("a"))
        .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;
    let waiter = {
        let (locker, name, history) = (cx.locker(&b, cx.long_ttl()), name.clone(), history.clone());
        let wait = cx.scaled(Duration::from_secs(30)) + ttl * 4;
        tokio::spawn(async move {
            let invoked = Instant::now();
            let guard = locker.acquire_timeout(&name, wait).await?;
            let at = history.granted(1, &name, guard.fencing_token(), invoked);
            let live = guard.is_held();
            Ok::<_, lockcore::LockError>((guard, at, Instant::now(), live))
        })
    };

    store
        .pause()
        .await
        .map_err(|e| Failure::new(format!("SIGSTOP failed: {e}")))?;
    let paused = Instant::now();
    let lost = tokio::time::timeout(ttl + cx.slack(ttl), guard.lost()).await;
    let fired = Instant::now();
    tokio::time::sleep_until(paused + ttl + ttl / 2).await;
    store
        .resume()
        .await
        .map_err(|e| Failure::new(format!("SIGCONT failed: {e}")))?;
    let resumed = Instant::now();
    let reason = lost.map_err(|_| {
        Failure::new(format!(
            "C6: A's lost() did not fire while the store was stopped ({:?} after SIGSTOP; guard: held={}, \
             deadline in {:?}, loss={:?})",
            fired - paused,
            guard.is_held(),
            guard.lease().deadline().checked_duration_since(Instant::now()),
            guard.loss_reason()
        ))
    })?;
    let deadline = guard.lease().deadline();
    history.end(grant_a, fired.min(deadline));
    let slack = timer_slack(cx).await;
    ensure!(
        fired <= deadline + slack,
        "C6: A's lost() ({reason}) fired {:?} after its deadline",
        fired - deadline
    );

    let within = ttl + cx.slack(ttl);
    let (guard_b, grant_b, granted, live_b) = tokio::time::timeout(within, waiter)
        .await
        .map_err(|_| {
            Failure::new(format!(
                "L1: the waiter did not get the lock within {within:?} after SIGCONT"
            ))
        })?
        .map_err(|e| Failure::new(format!("waiter task failed: {e}")))??;
    ensure!(
        granted.saturating_duration_since(resumed) <= within,
        "L1: granted {:?} after resume",
        granted - resumed
    );
    ensure!(
        live_b,
        "L1: the waiter's acquire returned a lease already past its deadline ({:?} after resume)",
        granted.saturating_duration_since(resumed)
    );
    ensure!(
        guard_b.fencing_token() > fence_a,
        "F1: fence {} not above A's {fence_a}",
        guard_b.fencing_token()
    );
    resource
        .write(guard_b.fencing_token(), |v| v.push("b"))
        .map_err(|e| Failure::new(format!("B's write refused: {e}")))?;
    stale_write_refused(&resource, fence_a, "A")?;
    history.end(grant_b, Instant::now());
    let (held_b, loss_b) = (guard_b.is_held(), guard_b.loss_reason());
    let left_b = guard_b
        .lease()
        .deadline()
        .checked_duration_since(Instant::now());
    let released = guard_b.release().await?;
    ensure!(
        released == ReleaseOutcome::Released,
        "B's release: {released:?} (granted {:?} after resume; before the release: held={held_b}, \
         deadline in {left_b:?}, loss={loss_b:?})",
        granted.saturating_duration_since(resumed)
    );
    drop(guard);
    check_history(&history)?;
    Ok(Outcome::Passed)
}
