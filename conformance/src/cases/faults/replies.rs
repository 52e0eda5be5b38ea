//! T3.2, T3.3: the reply to an acquire or a release is lost; T3.12: a
//! grant reaches its waiter late.

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, LeaseKind, LockBackend};
use tokio::time::Instant;

use crate::kit::proxy::Mode;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

use super::support::{fault_ttl, joined, proxied, wait_for};

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

/// T3.12: a grant reaches its waiter late (the reply or the notification
/// that carries it held up in the network). The waiter's lease counts from
/// its own request, or the proof of life the store granted on, never from
/// the message's arrival: the end it believes in is never after the end
/// the store keeps. The waiter waits through a `Locker` while the holder
/// releases, so a store that hands the name on at the release (its grant
/// then comes as a notification) is checked on that path.
pub async fn late_grant_counts_from_the_waiters_request(cx: &Ctx) -> CaseResult {
    if matches!(cx.caps().lease_kind, LeaseKind::Session { .. }) {
        skip!("session leases end with the session, not at an expiry of the grant's own");
    }
    let (proxy, a) = match proxied(cx).await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let b = cx.client().await?;
    let name = cx.name("late-grant");
    let ttl = cx.long_ttl();
    let granularity = cx.caps().ttl_granularity;
    // Longer than what the check below allows for (the store's rounding,
    // twice: the TTL it keeps, the time left it reports; and inspect's
    // round trip), and well inside a backend's request timeout.
    let late = granularity * 2 + cx.scaled(Duration::from_millis(250));
    let held = cx.must_acquire(&b, &name, ttl).await?;
    let give_up = Instant::now() + late * 4 + cx.scaled(Duration::from_secs(10));
    let waiter = wait_for(cx.locker(&a, ttl), name.clone(), give_up);
    // Let the waiter's first request reach the store and come back (held):
    // the grant is then the release's. Either way its message is late.
    tokio::time::sleep(cx.round_trip()).await;
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    b.release(&held).await?;
    let taken = joined("the waiter", waiter)
        .await?
        .ok_or_else(|| Failure::new("the waiter was never granted the released name"))?;
    proxy.set(Mode::Pass);
    let lease = taken.grant.lease();
    let believed = lease.issued().mono() + lease.ttl().get();
    let holder = b
        .inspect(&name)
        .await?
        .ok_or_else(|| Failure::new("inspect saw no holder of the granted name"))?;
    let looked = Instant::now();
    ensure!(
        holder.fence == lease.fence(),
        "inspect shows fence {}, the waiter holds {}",
        holder.fence,
        lease.fence()
    );
    let Some(left) = holder.expires_in else {
        skip!("inspect reports no time left, so the store's end cannot be compared");
    };
    let kept = looked + left + granularity;
    ensure!(
        believed <= kept,
        "S3: a grant that arrived {late:?} late is believed to end {:?} after the store's end: \
         its lease counts from the message, not from the waiter's request",
        believed - kept
    );
    taken.grant.release().await?;
    Ok(Outcome::Passed)
}
