//! S4: renewal extends the lease, keeps the fence, and never resurrects.

use std::time::Duration;

use lockcore::{Lease, LockError, ReleaseOutcome};
use tokio::time::Instant;

use super::deadline_overshoot;
use crate::{CaseResult, Ctx, Outcome, ensure, skip};

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
        ensure!(
            renewed.deadline() <= sent + renewed.ttl(),
            "the renewed deadline lies {:?} past the renew call's send time + TTL: it must \
             count from that send time (not from a later internal retry, nor the reply)",
            renewed.deadline() - (sent + renewed.ttl())
        );
        lease = renewed;
        cx.must_be_held(&b, &name, "its holder kept renewing")
            .await?;
    }
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
