//! Closing a client: nothing it held, nor any clean-up it owed the store,
//! outlives `close`. A process calls it right before it exits (a CLI that
//! timed out, a worker on SIGTERM), so work left to the background would be
//! cut short and block others until a TTL ran out.

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{LockError, LossReason};

use crate::{CaseResult, Ctx, Outcome, ensure};

/// `Locker::close` loses every guard at once (`LossReason::Closed`), releases
/// what they held (a dropped guard's background release included), and
/// closes the backend: another client takes both names at once, the closed
/// client refuses work with `Unavailable`, and a second close is harmless.
pub async fn close_loses_and_frees_what_it_held(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let (held, dropped) = (cx.name("close-held"), cx.name("close-dropped"));
    let locker = cx.locker(&a, cx.long_ttl());
    let guard = locker.acquire(&held).await?;
    drop(locker.acquire(&dropped).await?);
    locker.close().await?;
    ensure!(!guard.is_held(), "a guard still reads held after close");
    ensure!(
        guard.loss_reason() == Some(LossReason::Closed),
        "the guard's loss reason after close: {:?}",
        guard.loss_reason()
    );
    for name in [&held, &dropped] {
        let next = cx.must_acquire(&b, name, cx.long_ttl()).await?;
        b.release(&next).await?;
    }
    match a
        .try_acquire_for(&cx.name("close-after"), cx.long_ttl())
        .await
    {
        Err(LockError::Unavailable { .. }) => {}
        other => {
            return Err(crate::Failure::new(format!(
                "a closed client must refuse work with Unavailable, got {other:?}"
            )));
        }
    }
    locker.close().await?;
    Ok(Outcome::Passed)
}

/// A waiter that gave up (timed out, or its acquire future dropped) and
/// whose client is closed right away, as a process exits right after, leaves
/// nothing behind: once the holder releases, another client takes the name
/// at once, neither blocked by a leftover queue entry nor beaten to it.
pub async fn closed_waiter_leaves_nothing(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("close-waiter");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let wait = cx.scaled(Duration::from_millis(200));
    for gives_up in ["times out", "is dropped"] {
        let waiter = cx.locker(&cx.client().await?, cx.long_ttl());
        match gives_up {
            "times out" => {
                let outcome = waiter.acquire_timeout(&name, wait).await;
                ensure!(
                    matches!(outcome, Err(LockError::Timeout { .. })),
                    "expected Timeout, got {outcome:?}"
                );
            }
            _ => {
                let outcome = tokio::time::timeout(wait, waiter.acquire(&name)).await;
                ensure!(
                    outcome.is_err(),
                    "the acquire should still have been waiting"
                );
            }
        }
        waiter.close().await?;
    }
    a.release(&lease).await?;
    let next = cx.must_acquire(&b, &name, cx.long_ttl()).await?;
    b.release(&next).await?;
    Ok(Outcome::Passed)
}
