//! T3.2, T3.3: the reply to an acquire or a release is lost.

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LockBackend};
use tokio::time::Instant;

use crate::kit::proxy::Mode;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

use super::support::{fault_ttl, proxied};

/// T3.2: the reply to an acquire is lost (the store acts on the request,
/// the client never hears back). The caller gets an error or a timeout,
/// never a hang; whatever the store granted or queued for it does not
/// block the name beyond one TTL (+ slack): another client gets the lock
/// by then, with a larger fence. Once the network heals, the caller's
/// retry finds the lock held by that client (never granted to both),
/// and gets it after its release: no deadlock on its own leftovers.
pub async fn lost_acquire_reply_leaves_no_phantom(cx: &Ctx) -> CaseResult {
    let (proxy, a) = match proxied(cx).await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let b = cx.client().await?;
    let name = cx.name("acquire-reply-lost");
    let ttl = fault_ttl(cx);
    let before = cx.must_acquire(&b, &name, cx.long_ttl()).await?;
    b.release(&before).await?;

    proxy.set(Mode::DropDownstream);
    let started = Instant::now();
    let blind = tokio::time::timeout(ttl + cx.slack(ttl), a.try_acquire_for(&name, ttl)).await;
    ensure!(
        !matches!(blind, Ok(Ok(_))),
        "try_acquire returned an answer through a proxy that drops every reply: {blind:?}"
    );
    let next = cx
        .eventually(
            (started + ttl + cx.slack(ttl)).saturating_duration_since(Instant::now()),
            "acquisition by another client after an acquire whose reply was lost",
            || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
        )
        .await?;
    ensure!(
        next.fence() > before.fence(),
        "F1: fence {} after the lost reply is not above {}",
        next.fence(),
        before.fence()
    );

    proxy.set(Mode::Pass);
    let healed = cx.scaled(Duration::from_secs(10));
    cx.eventually(
        healed,
        "a definite answer once the network healed",
        || async {
            match a.try_acquire_for(&name, ttl).await {
                Ok(Attempt::Held { .. }) => Ok(Some(())),
                Ok(Attempt::Acquired(lease)) => Err(Failure::new(format!(
                    "S1: granted fence {} while another client holds fence {}",
                    lease.fence(),
                    next.fence()
                ))),
                Err(e) if e.is_retryable() => Ok(None),
                Err(e) => Err(Failure::new(format!("after healing: {e}"))),
            }
        },
    )
    .await?;
    b.release(&next).await?;
    let retried = cx
        .eventually(
            healed,
            "the caller's own acquisition after healing",
            || async {
                match a.try_acquire_for(&name, ttl).await {
                    Ok(attempt) => Ok(attempt.into_lease()),
                    Err(e) if e.is_retryable() => Ok(None),
                    Err(e) => Err(Failure::new(format!("after healing: {e}"))),
                }
            },
        )
        .await?;
    ensure!(
        retried.fence() > next.fence(),
        "F1: fence {} after healing is not above {}",
        retried.fence(),
        next.fence()
    );
    a.release(&retried).await?;
    Ok(Outcome::Passed)
}

/// T3.3: the reply to a release is lost. The caller gets an error or a
/// timeout, never a hang; the lock is free again within one TTL (+
/// slack) and the next grant has a larger fence.
pub async fn lost_release_reply_frees_within_ttl(cx: &Ctx) -> CaseResult {
    let (proxy, a) = match proxied(cx).await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let b = cx.client().await?;
    let name = cx.name("release-reply-lost");
    let ttl = fault_ttl(cx);
    let lease = cx.must_acquire(&a, &name, ttl).await?;
    proxy.set(Mode::DropDownstream);
    let started = Instant::now();
    // Whatever the answer (an error, a timeout, or Released from a retry on
    // a fresh connection), the lock must be free within TTL + slack.
    let _ = tokio::time::timeout(ttl + cx.slack(ttl), a.release(&lease)).await;
    let next = cx
        .eventually(
            (started + ttl + cx.slack(ttl)).saturating_duration_since(Instant::now()),
            "acquisition after a release whose reply was lost",
            || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
        )
        .await?;
    ensure!(next.fence() > lease.fence(), "F1: fence did not grow");
    proxy.set(Mode::Pass);
    b.release(&next).await?;
    Ok(Outcome::Passed)
}
