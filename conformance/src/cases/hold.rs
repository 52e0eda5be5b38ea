//! Hold caps: `Locker::max_hold` ends a hold that renewals would keep alive,
//! and frees the lock for the next holder.

use lockcore::backend::LockBackendExt;
use lockcore::{LossReason, ReleaseOutcome};
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure};

/// With `max_hold(cap)`, a guard whose renewals succeed (the store still
/// holds the lock past its first TTL) fires `lost()` with `MaxHoldExceeded`
/// no earlier than the cap and within a round trip after it, and releases the
/// lock: another client gets it within a round trip of the loss.
pub async fn max_hold_ends_the_hold(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("capped");
    let ttl = cx.short_ttl();
    let slack = cx.caps().slack_for(ttl);
    // Long enough that the lock outlives its first TTL (and the store's slack)
    // only by renewing, with a round trip to look at it in between.
    let cap = ttl * 2 + slack + cx.round_trip();
    let locker = cx.locker(&a, ttl).renew_every(ttl / 4).max_hold(cap);
    let asked = Instant::now();
    let guard = locker.acquire(&name).await?;
    let got = Instant::now();
    let first = guard.lease().issued().mono();
    tokio::time::sleep_until(got + ttl + slack).await;
    ensure!(
        guard.is_held(),
        "the guard was lost before its cap: {:?}",
        guard.loss_reason()
    );
    cx.must_be_held(&b, &name, "its holder was renewing it past its first TTL")
        .await?;
    let late = got + cap + cx.round_trip();
    let reason = tokio::time::timeout_at(late, guard.lost())
        .await
        .map_err(|_| {
            Failure::new(format!(
                "lost() did not fire within a round trip of the {cap:?} hold cap"
            ))
        })?;
    let fired = Instant::now();
    ensure!(
        reason == LossReason::MaxHoldExceeded,
        "a capped hold ended with {reason:?}, expected MaxHoldExceeded"
    );
    ensure!(
        fired >= asked + cap,
        "lost() fired after {:?}, before the {cap:?} cap",
        fired - asked
    );
    ensure!(
        guard.lease().issued().mono() > first,
        "no renewal was adopted before the cap: the cap must end a hold renewals keep alive"
    );
    ensure!(!guard.is_held(), "is_held() must be false past the cap");
    // The guard is kept (not dropped): the cap itself must release the lock.
    let next = cx
        .eventually(
            cx.round_trip(),
            "acquisition after the hold cap",
            || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
        )
        .await?;
    ensure!(
        next.fence() > guard.fencing_token(),
        "fence must grow after a capped hold"
    );
    b.release(&next).await?;
    let outcome = guard.release().await?;
    ensure!(
        outcome == ReleaseOutcome::NotHeld,
        "releasing a capped guard afterwards must report NotHeld, got {outcome:?}"
    );
    Ok(Outcome::Passed)
}
