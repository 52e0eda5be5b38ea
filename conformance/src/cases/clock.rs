//! T3.9: the store's clock steps. What a step does depends on the clock the
//! backend declares that expiry is judged on
//! ([`Capabilities::expiry_clock`](lockcore::Capabilities::expiry_clock)),
//! and the case checks the declared behaviour:
//!
//! - [`StoreWallClock`](lockcore::ExpiryClock::StoreWallClock): a forward step frees
//!   a lock early, before its holder's local deadline. That is the
//!   documented violation such a store brings; what must still hold is that
//!   the holder learns it at its next renewal, the next holder gets a larger
//!   fence, and the old holder's fenced write is refused. A backward step
//!   delays expiry: an abandoned lease outlives its TTL, and a held lock is
//!   never freed by it.
//! - any other clock: a wall-clock step changes nothing; the holder keeps
//!   its lock to its deadline.
//!
//! Needs a private store whose clock the harness can step
//! ([`StoreControl::step_clock`]; PostgreSQL
//! under libfaketime). libfaketime hangs redis-server and Go (etcd) ignores
//! it; for those stores the case skips, saying so, and a forward step is
//! what `force_release` emulates, which the admin and loss cases cover.

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, FencedResource, LossReason, ReleaseOutcome};
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, StoreControl, ensure, skip};

/// A step of the store's clock does what the backend's declared expiry
/// clock says (see the module documentation).
pub async fn server_clock_steps_are_judged_on_the_server(cx: &Ctx) -> CaseResult {
    let clock = cx.caps().expiry_clock;
    let (private, store) = match cx.private_store().await? {
        Ok(p) => p,
        Err(why) => skip!("expiry is judged on {clock}; {why}"),
    };
    if let Err(e) = store.step_clock(0).await {
        skip!("expiry is judged on {clock}, and the store's clock cannot be stepped here: {e}");
    }
    let outcome = if clock.steps_with_wall_clock() {
        wall_clock_steps(cx, &private, &*store).await
    } else {
        other_clock_steps(cx, &private, &*store).await
    };
    store
        .step_clock(0)
        .await
        .map_err(|e| Failure::new(format!("cannot reset the store's clock: {e}")))?;
    outcome
}

/// A TTL long enough that a step's effect cannot be mistaken for expiry:
/// 4 s (scaled), within the backend's range.
fn step_ttl(cx: &Ctx) -> Result<Duration, Failure> {
    Ok(cx
        .caps()
        .effective_ttl(cx.scaled(Duration::from_secs(4)).max(cx.caps().min_ttl))?
        .get())
}

async fn step(store: &dyn StoreControl, offset_secs: i64) -> Result<(), Failure> {
    store.step_clock(offset_secs).await.map_err(|e| {
        Failure::new(format!(
            "cannot step the store's clock to {offset_secs:+} s: {e}"
        ))
    })
}

/// `StoreWallClock`: forward frees early (as declared), backward delays.
async fn wall_clock_steps(
    cx: &Ctx,
    private: &std::sync::Arc<dyn crate::Factory>,
    store: &dyn StoreControl,
) -> CaseResult {
    let a = cx.private_client(private).await?;
    let b = cx.private_client(private).await?;
    let name = cx.name("clock-forward");
    let abandoned = cx.name("clock-backward");
    let ttl = step_ttl(cx)?;
    let every = ttl / 4;
    let guard = cx.locker(&a, ttl).renew_every(every).acquire(&name).await?;
    let old = guard.fencing_token();
    let resource = FencedResource::new(Vec::new());
    resource
        .write(old, |v| v.push("a"))
        .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;

    // One hour forward: on the store every lease is now expired, long before
    // its holder's local deadline.
    step(store, 3600).await?;
    let next = cx
        .eventually(
            cx.slack(ttl),
            "a grant after the store's clock jumped past the TTL (the backend declares \
             expiry on the store's wall clock)",
            || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
        )
        .await?;
    let granted = Instant::now();
    let deadline = guard.lease().deadline();
    ensure!(
        granted < deadline,
        "the backend declares expiry on the store's wall clock, yet a 1 h forward step did not \
         free the lock before its holder's deadline (granted {:?} after it)",
        granted - deadline
    );
    ensure!(
        next.fence() > old,
        "F1: fence {} after the clock step is not above {old}",
        next.fence()
    );
    let reason = tokio::time::timeout(every + cx.slack(ttl), guard.lost())
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

    // A lease taken now, then one hour back: its expiry moves an hour away.
    let short = cx.short_ttl();
    let left = cx.must_acquire(&a, &abandoned, short).await?;
    step(store, 0).await?;
    let stepped = Instant::now();
    ensure!(
        matches!(
            a.try_acquire_for(&name, cx.long_ttl()).await?,
            Attempt::Held { .. }
        ),
        "S1: a backward clock step freed a held lock"
    );
    tokio::time::sleep_until(stepped + short + cx.slack(short)).await;
    cx.must_be_held(
        &b,
        &abandoned,
        "a backward step of the store's wall clock must delay its expiry (TTL + slack had passed)",
    )
    .await?;
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
    ensure!(
        a.release(&left).await? == ReleaseOutcome::Released,
        "the lease whose expiry the backward step delayed could not be released"
    );
    let after = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    ensure!(
        after.fence() > next.fence(),
        "F1: fence did not grow after the steps"
    );
    a.release(&after).await?;
    Ok(Outcome::Passed)
}

/// Any other clock: a forward step frees nothing before the holder's
/// deadline and a backward step delays nothing.
async fn other_clock_steps(
    cx: &Ctx,
    private: &std::sync::Arc<dyn crate::Factory>,
    store: &dyn StoreControl,
) -> CaseResult {
    let clock = cx.caps().expiry_clock;
    let a = cx.private_client(private).await?;
    let b = cx.private_client(private).await?;
    let name = cx.name("clock-step");
    let ttl = step_ttl(cx)?;
    let lease = cx.must_acquire(&a, &name, ttl).await?;
    step(store, 3600).await?;
    while Instant::now() + cx.round_trip() < lease.deadline() {
        cx.must_be_held(
            &b,
            &name,
            &format!("its holder's deadline had not passed (a forward wall-clock step; expiry is judged on {clock})"),
        )
        .await?;
        tokio::time::sleep(ttl / 10).await;
    }
    step(store, -3600).await?;
    let freed = cx
        .eventually(
            (lease.issued().mono() + cx.freed_within(ttl))
                .saturating_duration_since(Instant::now()),
            &format!("expiry after a backward wall-clock step (expiry is judged on {clock})"),
            || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
        )
        .await?;
    ensure!(freed.fence() > lease.fence(), "F1: fence did not grow");
    b.release(&freed).await?;
    Ok(Outcome::Passed)
}
