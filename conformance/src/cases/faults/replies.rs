//! T3.2, T3.3: the reply to an acquire or a release is lost; T3.12: a
//! grant reaches its waiter late; T3.13: an attempt is dropped while its
//! request is in flight.

use std::time::Duration;

use std::sync::Arc;

use lockcore::backend::{Kind, LockBackendExt, LockRequest};
use lockcore::{Access, Attempt, LeaseKind, LockBackend, LockName};
use tokio::time::Instant;

use crate::kit::proxy::{FaultProxy, Mode};
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

/// T3.13: an attempt dropped while its request is in flight (its caller
/// timed out or was cancelled first), for a lock, a semaphore's permit and
/// a reader-writer lock's write, as the backend keeps them. The store may
/// have granted it; that grant is never renewed and frees the name within
/// one TTL (+ slack), also while the same client holds another lock and
/// keeps renewing it (a store whose grants ride on a session the client
/// keeps alive must undo the dropped one, not keep it for as long as the
/// session lives).
pub async fn dropped_attempt_leaves_no_phantom(cx: &Ctx) -> CaseResult {
    let (proxy, a) = match proxied(cx).await? {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let b = cx.client().await?;
    // Long enough to see a grant in the store before its reply is back,
    // and well inside a backend's request timeout (Redis's is 1 s).
    let late = cx.round_trip().min(cx.scaled(Duration::from_millis(400)));
    // The lock beside the attempts renews through the same slow link: its
    // renewals, late by as much, must come back well inside its TTL.
    let want = fault_ttl(cx).max(late * 8);
    let ttl = cx.caps().effective_ttl(want).map_or(want, |t| t.get());
    let kept = cx
        .locker(&a, ttl)
        .acquire(cx.name("dropped-attempt-beside"))
        .await?;
    let caps = cx.caps();
    let kinds = [
        (Kind::Lock, true),
        (Kind::Semaphore, caps.semaphores),
        (Kind::ReadWrite, caps.rw_locks),
    ];
    for (kind, _) in kinds.into_iter().filter(|(_, kept_by)| *kept_by) {
        dropped_in_flight(cx, &proxy, [&a, &b], late, ttl, kind).await?;
    }
    ensure!(
        kept.is_held(),
        "the other lock of the dropped attempts' client was lost meanwhile"
    );
    kept.release().await?;
    Ok(Outcome::Passed)
}

/// Rounds of [`dropped_in_flight`] before it gives up finding an attempt
/// whose grant shows in the store before its reply is back.
const ROUNDS: usize = 3;

/// An attempt by `a` (behind `proxy`, its replies `late`) at a `kind` (a
/// lock, a permit of one, a write), dropped once `b` sees its grant in
/// the store and before its reply is back; then `b` must get it within one
/// TTL (+ slack), with a larger fence.
async fn dropped_in_flight(
    cx: &Ctx,
    proxy: &FaultProxy,
    [a, b]: [&Arc<dyn LockBackend>; 2],
    late: Duration,
    ttl: Duration,
    kind: Kind,
) -> Result<(), Failure> {
    let what = match kind {
        Kind::Semaphore => "permit",
        Kind::ReadWrite => "write",
        _ => "lock",
    };
    let ask = |name: &LockName, ttl| -> Result<LockRequest, Failure> {
        let request = cx.request(name, ttl)?;
        Ok(match kind {
            Kind::Semaphore => request.with_permits(1),
            Kind::ReadWrite => request.with_access(Access::Write),
            _ => request,
        })
    };
    let mut ended = Vec::new();
    for round in 1..=ROUNDS {
        let name = cx.name(&format!("dropped-attempt-{what}-{round}"));
        let then = ask(&name, cx.long_ttl())?;
        proxy.set(Mode::DelayDownstream {
            base: late,
            jitter: Duration::ZERO,
        });
        let attempt = tokio::spawn({
            let (a, request) = (a.clone(), ask(&name, ttl)?);
            async move { a.try_acquire(&request).await }
        });
        // Its write may follow requests of its own, each answered `late`.
        let seen = cx
            .eventually(
                cx.scaled(Duration::from_secs(10)),
                &format!("the {what} attempt's grant in the store, or its end"),
                || async {
                    let over = attempt.is_finished();
                    let holders = b.holders(&name, then.kind()).await?;
                    Ok((over || !holders.is_empty()).then(|| holders.into_iter().next()))
                },
            )
            .await?;
        let Some(seen) = seen.filter(|_| !attempt.is_finished()) else {
            // Answered first (or failed): no drop to judge. Again.
            proxy.set(Mode::Pass);
            let outcome = attempt.await;
            if let Ok(Ok(Attempt::Acquired(lease))) = &outcome {
                a.release(lease).await?;
            }
            ended.push(format!("{outcome:?}"));
            continue;
        };
        attempt.abort();
        let dropped = Instant::now();
        let _ = attempt.await;
        proxy.set(Mode::Pass);
        let next = cx
            .eventually(
                (dropped + ttl + cx.slack(ttl)).saturating_duration_since(Instant::now()),
                &format!("the {what} free after an attempt dropped in flight"),
                || async { Ok(b.try_acquire(&then).await?.into_lease()) },
            )
            .await?;
        ensure!(
            next.fence() > seen.fence,
            "F1: {what} fence {} after the dropped attempt is not above its {}",
            next.fence(),
            seen.fence
        );
        b.release(&next).await?;
        return Ok(());
    }
    Err(Failure::new(format!(
        "in {ROUNDS} rounds, no {what} attempt was seen granted before its reply came back \
         (replies {late:?} late); they ended: {}",
        ended.join("; ")
    )))
}
