//! S4: renewal extends the lease, keeps the fence, and never resurrects.

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Lease, LockError, ReleaseOutcome};
use tokio::time::Instant;

use super::deadline_overshoot;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// Renewing every third of the TTL keeps the lock for three TTLs, with the
/// same fencing token and a deadline that moves forward, counted from the
/// renew call's send time: a backend that retries internally and stamps the
/// lease with its late retry is caught. Then, with a long TTL (a large drift
/// margin), renewed deadlines must count from the send time minus the drift
/// (best of three renewals).
pub async fn renew_extends_and_keeps_fence(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("renewed");
    let ttl = cx.short_ttl();
    let mut lease = cx.must_acquire(&a, &name, ttl).await?;
    let first = lease.clone();
    let until = Instant::now() + ttl * 3;
    // The least any renewal's deadline lies past its call's send time +
    // TTL: one renewal delayed inside the call (a loaded machine, a wait for
    // a shared stream) may read its clock late, but a backend that counts
    // from a later retry or the reply does so every time.
    let mut least_past = Duration::MAX;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 3).await;
        let sent = Instant::now();
        let renewed = a.renew(&lease).await?;
        ensure!(
            renewed.fence() == first.fence(),
            "renew changed the fence {} -> {}",
            first.fence(),
            renewed.fence()
        );
        ensure!(
            renewed.deadline() > lease.deadline(),
            "renew must move the local deadline forward"
        );
        least_past = least_past.min(
            renewed
                .deadline()
                .saturating_duration_since(sent + renewed.ttl().get()),
        );
        lease = renewed;
        cx.must_be_held(&b, &name, "its holder kept renewing")
            .await?;
    }
    ensure!(
        least_past.is_zero(),
        "the renewed deadline lies past the renew call's send time + TTL in every renewal \
         (by {least_past:?} at least): it must count from that send time (not from a later \
         internal retry, nor the reply)"
    );
    ensure!(
        a.release(&lease).await? == ReleaseOutcome::Released,
        "release after renewals should succeed"
    );

    let long = cx.long_ttl();
    let mut lease = cx.must_acquire(&a, &cx.name("renewed-long"), long).await?;
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let sent = Instant::now();
        let renewed = a.renew(&lease).await?;
        best = best.min(deadline_overshoot(cx, &renewed, sent, Instant::now()));
        lease = renewed;
    }
    a.release(&lease).await?;
    ensure!(
        best.is_zero(),
        "the renewed deadline of a {long:?} lease lies {best:?} past send time + TTL - drift \
         ({:?}) + half the call, in the best of 3 renewals: it must count from the renew \
         call's send time, with the drift margin",
        Lease::drift(long)
    );
    Ok(Outcome::Passed)
}

/// Once a lease expired, renew fails and does not re-create the lock, and the
/// old holder cannot renew or release the next holder's lock.
pub async fn renew_after_expiry_fails(cx: &Ctx) -> CaseResult {
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per lock (covered by the fault cases)");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("expired");
    let ttl = cx.short_ttl();
    let lease = cx.must_acquire(&a, &name, ttl).await?;
    cx.eventually(
        ttl + cx.slack(ttl),
        "expiry of an unrenewed lease",
        || async { Ok(b.inspect(&name).await?.is_none().then_some(())) },
    )
    .await?;
    let renewed = a.renew(&lease).await;
    ensure!(
        matches!(renewed, Err(LockError::NotHeld { .. })),
        "renew after expiry must be NotHeld, got {renewed:?}"
    );
    ensure!(
        b.inspect(&name).await?.is_none(),
        "a refused renew must not resurrect the lock"
    );
    let next = cx.must_acquire(&b, &name, cx.long_ttl()).await?;
    ensure!(
        next.fence() > lease.fence(),
        "fence must grow after expiry: {} then {}",
        lease.fence(),
        next.fence()
    );
    let renewed = a.renew(&lease).await;
    ensure!(
        matches!(renewed, Err(LockError::NotHeld { .. })),
        "the expired holder's renew must be NotHeld, got {renewed:?}"
    );
    ensure!(
        a.release(&lease).await? == ReleaseOutcome::NotHeld,
        "the expired holder's release must be NotHeld"
    );
    let holder = a.inspect(&name).await?;
    ensure!(
        holder.map(|h| h.fence) == Some(next.fence()),
        "the expired holder must not touch the next holder's lock"
    );
    b.release(&next).await?;
    Ok(Outcome::Passed)
}

/// A batch renewal (`renew_many`, what a `Locker`'s renewer sends) judges
/// each lease on its own, exactly as `renew` would: in a batch of two live
/// leases around a released one and one whose name another client has
/// taken since, only the live two are renewed, each outcome in its lease's
/// place, and the refused ones resurrect and disturb nothing.
pub async fn renew_many_judges_each_lease(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let ttl = cx.long_ttl();
    let first = cx.must_acquire(&a, &cx.name("batch-first"), ttl).await?;
    let released_name = cx.name("batch-released");
    let released = cx.must_acquire(&a, &released_name, ttl).await?;
    ensure!(
        a.release(&released).await? == ReleaseOutcome::Released,
        "release of a live lease should succeed"
    );
    let taken_name = cx.name("batch-taken");
    let taken = cx.must_acquire(&a, &taken_name, ttl).await?;
    a.release(&taken).await?;
    let now_b = cx.must_acquire(&b, &taken_name, ttl).await?;
    let last = cx.must_acquire(&a, &cx.name("batch-last"), ttl).await?;
    let batch = [first.clone(), released, taken, last.clone()];
    let outcomes = a.renew_many(&batch).await;
    ensure!(
        outcomes.len() == batch.len(),
        "renew_many returned {} outcomes for {} leases",
        outcomes.len(),
        batch.len()
    );
    for (i, live) in [(0, &first), (3, &last)] {
        match &outcomes[i] {
            Ok(renewed) => ensure!(
                renewed.name() == live.name()
                    && renewed.fence() == live.fence()
                    && renewed.deadline() >= live.deadline(),
                "lease {i} of the batch came back as another lease or an earlier deadline: \
                 {renewed:?} for {live:?}"
            ),
            Err(e) => {
                return Err(Failure::new(format!(
                    "live lease {i} of the batch was not renewed: {e}"
                )));
            }
        }
    }
    for (i, what) in [
        (1, "a released lease"),
        (2, "a lease whose name another client holds"),
    ] {
        ensure!(
            matches!(outcomes[i], Err(LockError::NotHeld { .. })),
            "renew_many renewed {what} (position {i}): {:?}; each lease must be judged on its own",
            outcomes[i]
        );
    }
    ensure!(
        b.inspect(&released_name).await?.is_none(),
        "a refused batch renewal must not resurrect a released lock"
    );
    let holder = b.inspect(&taken_name).await?;
    ensure!(
        holder.as_ref().is_some_and(|h| h.fence == now_b.fence()),
        "a refused batch renewal must leave the new holder's lock alone: {holder:?}"
    );
    a.release(&first).await?;
    a.release(&last).await?;
    b.release(&now_b).await?;
    Ok(Outcome::Passed)
}
