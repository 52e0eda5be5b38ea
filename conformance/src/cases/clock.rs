//! T3.9: the store's clock steps. Expiry is judged on the store's clock, so
//! a forward step expires leases *on the store*: the holder must learn it at
//! its next renewal, the next holder gets a larger fence, and the old
//! holder's fenced write is refused. A backward step only lengthens leases.
//!
//! Needs a private store whose clock the harness can step
//! ([`StoreControl::step_clock`](crate::StoreControl::step_clock); PostgreSQL
//! under libfaketime). libfaketime hangs redis-server and Go (etcd) ignores
//! it; for those stores a forward step is what `force_release` emulates,
//! which the admin and loss cases cover.

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, FencedResource, LossReason, ReleaseOutcome};

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// A forward step of the store's clock past the TTL frees the lock on the
/// store; the holder is told at its next renewal and fenced out. A backward
/// step only extends a lease: nobody else gets the lock.
pub async fn server_clock_steps_are_judged_on_the_server(cx: &Ctx) -> CaseResult {
    if !cx.per_lock_leases() {
        skip!("session leases do not expire by the store's wall clock");
    }
    let (private, store) = match cx.private_store().await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    if let Err(e) = store.step_clock(0).await {
        skip!("the store's clock cannot be stepped here: {e}");
    }
    let a = cx.private_client(&private).await?;
    let b = cx.private_client(&private).await?;
    let name = cx.name("clock-forward");
    let ttl = cx
        .caps()
        .effective_ttl(cx.scaled(Duration::from_secs(4)).max(cx.caps().min_ttl))?
        .get();
    let every = ttl / 4;
    let guard = cx.locker(&a, ttl).renew_every(every).acquire(&name).await?;
    let old = guard.fencing_token();
    let resource = FencedResource::new(Vec::new());
    resource
        .write(old, |v| v.push("a"))
        .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;

    // One hour forward: every lease on the store is now expired.
    store
        .step_clock(3600)
        .await
        .map_err(|e| Failure::new(format!("cannot step the store's clock: {e}")))?;
    let next = cx
        .eventually(
            cx.slack(),
            "a grant after the store's clock jumped past the TTL",
            || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
        )
        .await?;
    ensure!(
        next.fence() > old,
        "F1: fence {} after the clock step is not above {old}",
        next.fence()
    );
    let reason = tokio::time::timeout(every + cx.slack(), guard.lost())
        .await
        .map_err(|_| {
            Failure::new(
                "the old holder was not told at its next renewal that the store expired its lease",
            )
        })?;
    ensure!(
        matches!(
            reason,
            LossReason::RenewalRefused | LossReason::StoreReported
        ),
        "unexpected loss reason {reason:?}"
    );
    resource
        .write(next.fence(), |v| v.push("b"))
        .map_err(|e| Failure::new(format!("the new holder's write was refused: {e}")))?;
    ensure!(
        resource.write(old, |v| v.push("stale")).is_err(),
        "the old holder's write was accepted"
    );
    ensure!(
        guard.release().await? == ReleaseOutcome::NotHeld,
        "the old holder's release touched the new grant"
    );

    // Back to one hour behind: leases only get longer, nobody gets a held lock.
    store
        .step_clock(-3600)
        .await
        .map_err(|e| Failure::new(format!("cannot step the store's clock back: {e}")))?;
    ensure!(
        matches!(
            a.try_acquire_for(&name, cx.long_ttl()).await?,
            Attempt::Held { .. }
        ),
        "S1: a backward clock step freed a held lock"
    );
    let renewed = b.renew(&next).await;
    ensure!(
        renewed.is_ok(),
        "the holder could not renew after a backward step: {renewed:?}"
    );
    let renewed = renewed?;
    ensure!(
        b.release(&renewed).await? == ReleaseOutcome::Released,
        "release after the steps failed"
    );
    let after = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    ensure!(
        after.fence() > next.fence(),
        "F1: fence did not grow after the steps"
    );
    a.release(&after).await?;
    store
        .step_clock(0)
        .await
        .map_err(|e| Failure::new(format!("cannot reset the store's clock: {e}")))?;
    Ok(Outcome::Passed)
}
