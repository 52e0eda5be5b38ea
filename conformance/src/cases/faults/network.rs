//! T3.1, T3.4, T3.5: the holder's link partitioned, slowed past its
//! deadline, or reset.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, FencedResource, LockBackend};
use tokio::time::Instant;

use crate::history::History;
use crate::kit::proxy::Mode;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

use super::support::{
    check_history, check_takeover, fault_ttl, joined, lost_by_deadline, poll_for, proxied,
    stale_write_refused, wait_for,
};

/// T3.1: the holder is partitioned (blackhole, no RST) for longer than
/// its TTL, holding two names. From the moment the partition starts, one
/// client polls `try_acquire` on the first and another waits in
/// `acquire` on the second. The holder's `lost()` fires by its local
/// deadline; neither contender is granted before that deadline, and each
/// gets its name within TTL + declared slack + a round trip of the
/// partition; after the partition heals, the old holder's fenced write
/// is refused and its guards stay lost.
pub async fn partitioned_holder_is_fenced_out(cx: &Ctx) -> CaseResult {
    let (proxy, a) = match proxied(cx).await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let (b, c, observer) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let polled = cx.name("partitioned");
    let waited = cx.name("partitioned-waited");
    let ttl = fault_ttl(cx);
    let history = History::new();
    let resource = FencedResource::new(Vec::new());

    let locker = cx.locker(&a, ttl);
    let invoked = Instant::now();
    let guard = locker.acquire(&polled).await?;
    let fence_a = guard.fencing_token();
    let grant_a = history.granted(0, &polled, fence_a, invoked);
    let guard_w = locker.acquire(&waited).await?;
    resource
        .write(fence_a, |v| v.push("a"))
        .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;

    proxy.set(Mode::Blackhole);
    let partitioned = Instant::now();
    let bound = cx.freed_within(ttl);
    let give_up = partitioned + bound * 2 + ttl;
    let poller = poll_for(
        b.clone(),
        polled.clone(),
        cx.long_ttl(),
        cx.scaled(Duration::from_millis(10)),
        give_up,
    );
    let waiter = wait_for(cx.locker(&c, cx.long_ttl()), waited.clone(), give_up);

    let (fired, deadline) = lost_by_deadline(cx, &guard, ttl, "the partition").await?;
    history.end(grant_a, fired.min(deadline));
    let (_, deadline_w) = lost_by_deadline(cx, &guard_w, ttl, "the partition").await?;

    let since = (partitioned, "the partition began");
    let taken_b = joined("B", poller).await?;
    let taken_c = joined("C", waiter).await?;
    check_takeover(
        "B (polling try_acquire)",
        &polled,
        taken_b.as_ref().map(|t| t.at),
        deadline,
        since,
        Some(bound),
    )?;
    check_takeover(
        "C (waiting in acquire)",
        &waited,
        taken_c.as_ref().map(|t| t.at),
        deadline_w,
        since,
        Some(bound),
    )?;
    let (Some(b_took), Some(c_took)) = (taken_b, taken_c) else {
        return Err(Failure::new("a contender got nothing (checked above)"));
    };
    let lease_b = b_took.grant;
    let grant_b = history.granted_at(1, &polled, lease_b.fence(), b_took.invoked, b_took.at);
    ensure!(
        lease_b.fence() > fence_a,
        "F1: B's fence {} is not above A's {fence_a}",
        lease_b.fence()
    );
    ensure!(
        c_took.grant.fencing_token() > guard_w.fencing_token(),
        "F1: C's fence {} is not above A's {}",
        c_took.grant.fencing_token(),
        guard_w.fencing_token()
    );
    resource
        .write(lease_b.fence(), |v| v.push("b"))
        .map_err(|e| Failure::new(format!("B's write refused: {e}")))?;

    proxy.set(Mode::Pass);
    stale_write_refused(&resource, fence_a, "A")?;
    tokio::time::sleep(ttl / 3 + cx.scaled(Duration::from_millis(100))).await;
    ensure!(
        !guard.is_held() && !guard_w.is_held(),
        "A's guard counts a lock held again after the partition healed"
    );
    cx.must_be_held(&observer, &polled, "B held it after the partition healed")
        .await?;
    cx.must_be_held(&observer, &waited, "C held it after the partition healed")
        .await?;
    drop((guard, guard_w));
    history.end(grant_b, Instant::now());
    b.release(&lease_b).await?;
    c_took.grant.release().await?;
    check_history(&history)?;
    Ok(Outcome::Passed)
}

/// T3.4: renewal replies are delayed beyond the lease's remaining
/// validity (the store renews, the client hears too late) while the
/// holder holds two names, and from that moment one client polls
/// `try_acquire` on the first and another waits in `acquire` on the
/// second. The guards count the leases lost at their deadlines and the
/// late replies do not resurrect them; nobody is granted a name before
/// its holder's deadline, and with per-lock leases each contender gets
/// its name within TTL + declared slack + a round trip of the holder's
/// loss (no renewal reaches the store after it); the old holder's fenced
/// write is refused.
pub async fn slow_renewal_counts_as_lost(cx: &Ctx) -> CaseResult {
    let (proxy, a) = match proxied(cx).await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let (b, c) = (cx.client().await?, cx.client().await?);
    let polled = cx.name("slow-renewal");
    let waited = cx.name("slow-renewal-waited");
    let ttl = fault_ttl(cx);
    let history = History::new();
    let resource = FencedResource::new(Vec::new());

    let locker = cx.locker(&a, ttl);
    let invoked = Instant::now();
    let guard = locker.acquire(&polled).await?;
    let fence_a = guard.fencing_token();
    let grant_a = history.granted(0, &polled, fence_a, invoked);
    let guard_w = locker.acquire(&waited).await?;
    resource
        .write(fence_a, |v| v.push("a"))
        .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;

    proxy.set(Mode::DelayDownstream {
        base: ttl,
        jitter: Duration::ZERO,
    });
    let delayed = Instant::now();
    let bound = cx.freed_within(ttl);
    // A session store may keep the session (and the locks) alive while
    // A's client stays connected: there only safety is checked, and the
    // contenders stop after about the old bound.
    let (bound, give_up) = if cx.per_lock_leases() {
        (Some(bound), delayed + ttl + bound * 2 + ttl)
    } else {
        (None, delayed + ttl + ttl / 3 + cx.slack(ttl))
    };
    let poller = poll_for(
        b.clone(),
        polled.clone(),
        cx.long_ttl(),
        cx.scaled(Duration::from_millis(10)),
        give_up,
    );
    let waiter = wait_for(cx.locker(&c, cx.long_ttl()), waited.clone(), give_up);

    let what = "renewal replies were delayed past the deadline";
    let (fired, deadline) = lost_by_deadline(cx, &guard, ttl, what).await?;
    history.end(grant_a, fired.min(deadline));
    let (fired_w, deadline_w) = lost_by_deadline(cx, &guard_w, ttl, what).await?;
    // Every delayed reply sent so far has arrived by now.
    tokio::time::sleep_until(delayed + ttl + ttl / 2).await;
    ensure!(
        !guard.is_held() && !guard_w.is_held(),
        "a renewal answered after the deadline resurrected the lease (S4)"
    );

    // No renewal is sent after the guard counts the lease lost, so the
    // store's lease ends by then + TTL (+ slack).
    let taken_b = joined("B", poller).await?;
    let taken_c = joined("C", waiter).await?;
    check_takeover(
        "B (polling try_acquire)",
        &polled,
        taken_b.as_ref().map(|t| t.at),
        deadline,
        (fired, "the holder counted its lease lost"),
        bound,
    )?;
    check_takeover(
        "C (waiting in acquire)",
        &waited,
        taken_c.as_ref().map(|t| t.at),
        deadline_w,
        (fired_w, "the holder counted its lease lost"),
        bound,
    )?;
    if let Some(took) = taken_c {
        ensure!(
            took.grant.fencing_token() > guard_w.fencing_token(),
            "F1: C's fence {} is not above A's {}",
            took.grant.fencing_token(),
            guard_w.fencing_token()
        );
        took.grant.release().await?;
    }
    if let Some(took) = taken_b {
        let lease_b = took.grant;
        let grant_b = history.granted_at(1, &polled, lease_b.fence(), took.invoked, took.at);
        resource
            .write(lease_b.fence(), |v| v.push("b"))
            .map_err(|e| Failure::new(format!("B's write refused: {e}")))?;
        stale_write_refused(&resource, fence_a, "A")?;
        history.end(grant_b, Instant::now());
        b.release(&lease_b).await?;
    }
    proxy.set(Mode::Pass);
    drop((guard, guard_w));
    check_history(&history)?;
    Ok(Outcome::Passed)
}

/// T3.5: the holder's connections are reset (RST) mid-hold. Either the
/// client reconnects and keeps the lock (the store still shows it as the
/// holder and nobody else gets it), or it reports the loss; never both
/// silently: nobody is granted the lock while the holder's guard still
/// counts on it (with per-lock leases, not for a moment; a session lock
/// dies with its connection on both sides, so there a moment is allowed).
pub async fn reset_mid_hold_keeps_or_reports(cx: &Ctx) -> CaseResult {
    let (proxy, a) = match proxied(cx).await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let b = cx.client().await?;
    let name = cx.name("reset");
    let ttl = fault_ttl(cx);
    let guard = cx.locker(&a, ttl).acquire(&name).await?;
    let fence_a = guard.fencing_token();
    let lost_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let watcher = {
        let (token, lost_at) = (guard.lost_token(), lost_at.clone());
        tokio::spawn(async move {
            token.cancelled().await;
            *lost_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        })
    };

    proxy.reset_existing();
    let until = Instant::now() + ttl * 2 + cx.slack(ttl);
    let mut taken = None;
    while Instant::now() < until {
        match b.try_acquire_for(&name, cx.long_ttl()).await {
            Ok(Attempt::Acquired(lease)) => {
                // Whether A still counted on the lock when B heard it won.
                let a_held = guard.is_held();
                taken = Some((lease, Instant::now(), a_held));
                break;
            }
            Ok(Attempt::Held { .. }) | Err(_) => {}
        }
        tokio::time::sleep(ttl / 10).await;
    }
    let outcome = match taken {
        None => {
            ensure!(
                guard.is_held(),
                "nobody could take the lock for 2 TTL after the reset, yet A's guard says it lost it ({:?})",
                guard.loss_reason()
            );
            let holder = b.inspect(&name).await?;
            ensure!(
                holder.as_ref().map(|h| h.fence) == Some(fence_a),
                "A's guard keeps the lock but the store shows {holder:?}"
            );
            guard.release().await?;
            Outcome::Passed
        }
        Some((lease_b, granted, a_held)) => {
            let deadline = guard.lease().deadline();
            if cx.per_lock_leases() {
                ensure!(
                    !a_held,
                    "S1: B was granted the lock (fence {}) while A's guard still counted on it \
                     ({:?} before A's deadline; loss: {:?})",
                    lease_b.fence(),
                    deadline.saturating_duration_since(granted),
                    guard.loss_reason()
                );
            }
            // B got it: A must have reported the loss, by its deadline and
            // (a session lock dies with its connection on both sides at
            // about the same time) no later than a moment after B's grant.
            let reason = tokio::time::timeout(ttl + cx.slack(ttl), guard.lost())
                .await
                .map_err(|_| {
                    Failure::new(format!(
                        "B was granted the lock (fence {}) but A's guard never reported the loss",
                        lease_b.fence()
                    ))
                })?;
            let _ = watcher.await;
            let lost = (*lost_at.lock().unwrap_or_else(|p| p.into_inner()))
                .ok_or_else(|| Failure::new("loss time not recorded"))?;
            ensure!(
                lost <= granted + cx.scaled(Duration::from_millis(250)) || deadline <= granted,
                "A's guard counted on the lock until {:?} after B was granted it ({reason})",
                lost - granted
            );
            ensure!(lease_b.fence() > fence_a, "F1: fence did not grow");
            b.release(&lease_b).await?;
            drop(guard);
            Outcome::Passed
        }
    };
    drop(proxy);
    Ok(outcome)
}
