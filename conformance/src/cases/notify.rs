//! Store wake-ups: a backend that declares `Capabilities::notifications`
//! must deliver them through `watch` (and `watch_permits`), promptly after a
//! release and not while nothing changes.

use std::future::Future;
use std::time::Duration;

use lockcore::backend::Kind;
use lockcore::backend::wait::Wakeup;
use lockcore::{LockError, ReleaseOutcome};

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// `watch` armed on a held lock completes within a round trip of the
/// holder's release, and not before it while the lock stays held.
pub async fn watch_wakes_on_release(cx: &Ctx) -> CaseResult {
    if !cx.caps().notifications {
        skip!("the backend declares no store notifications: waiters poll with backoff");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("watched");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let wakeup = b.watch(&name, Kind::Lock).await?;
    expect_wakeup(cx, "watch", wakeup, a.release(&lease)).await
}

/// The same for a semaphore: `watch_permits` armed while every permit is
/// taken completes within a round trip of a permit's release.
pub async fn watch_permits_wakes_on_release(cx: &Ctx) -> CaseResult {
    if !cx.caps().notifications {
        skip!("the backend declares no store notifications: permit waiters poll with backoff");
    }
    if !cx.caps().semaphores {
        skip!("the backend declares no semaphores");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("watched-permits");
    let lease = cx.must_acquire_permit(&a, &name, 1, cx.long_ttl()).await?;
    let wakeup = b.watch(&name, Kind::Semaphore).await?;
    expect_wakeup(cx, "watch_permits", wakeup, a.release(&lease)).await
}

/// Checks that `wakeup` stays pending while nothing changes, then completes
/// within a round trip of `release`.
async fn expect_wakeup(
    cx: &Ctx,
    what: &str,
    wakeup: Option<Wakeup>,
    release: impl Future<Output = Result<ReleaseOutcome, LockError>>,
) -> CaseResult {
    let Some(mut wakeup) = wakeup else {
        return Err(Failure::new(format!(
            "the backend declares notifications but {what} returned None: waiters would poll"
        )));
    };
    let quiet = cx.scaled(Duration::from_millis(300));
    ensure!(
        tokio::time::timeout(quiet, &mut wakeup).await.is_err(),
        "the {what} wake-up completed while the lock stayed held and unchanged"
    );
    let outcome = release.await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "the holder's release reported {outcome:?}"
    );
    let bound = cx.round_trip();
    ensure!(
        tokio::time::timeout(bound, wakeup).await.is_ok(),
        "the {what} wake-up did not come within {bound:?} of the release"
    );
    Ok(Outcome::Passed)
}
