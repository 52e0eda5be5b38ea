//! Inspection, forced release with audit, and truthful TTLs.

use std::time::Duration;

use lockcore::audit::{self, Stage};
use lockcore::backend::LockBackendExt;
use lockcore::{FencedResource, FencingToken, Lease, LeaseKind, LockError, Locker, ReleaseOutcome};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::deadline_overshoot;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure};

/// `inspect` shows nobody on a free name and the holder's fence and remaining
/// TTL on a held one.
pub async fn inspect_reports_the_holder(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("inspected");
    ensure!(
        b.inspect(&name).await?.is_none(),
        "a never-used name must have no holder"
    );
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let holder = b
        .inspect(&name)
        .await?
        .ok_or_else(|| Failure::new("inspect saw no holder of a held lock"))?;
    ensure!(
        holder.fence == lease.fence(),
        "inspect fence {} != lease fence {}",
        holder.fence,
        lease.fence()
    );
    if let Some(owner) = holder.owner {
        ensure!(owner == lease.owner(), "inspect shows another owner");
    }
    if let Some(left) = holder.expires_in {
        ensure!(
            left <= lease.ttl().get() + cx.caps().ttl_granularity && !left.is_zero(),
            "remaining TTL {left:?} is not within (0, {:?}]",
            lease.ttl()
        );
    }
    a.release(&lease).await?;
    ensure!(
        b.inspect(&name).await?.is_none(),
        "inspect must show no holder after release"
    );
    Ok(Outcome::Passed)
}

/// A forced release evicts the holder, is audited (one event before the
/// request, one with its outcome, same id), fences the old holder out (its
/// renew, release and fenced writes are refused), and the next holder gets a
/// larger token. Compare-and-evict (`force_release_if`) evicts only the
/// holder of the given fence, so a retry never evicts the next holder.
pub async fn force_release_fences_out_the_holder(cx: &Ctx) -> CaseResult {
    let (a, b, admin) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let admin = Locker::from_arc(admin);
    let name = cx.name("forced");
    let mut events = audit::subscribe();
    let old = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let resource = FencedResource::new(0_u32);
    resource
        .write(old.fence(), |v| *v += 1)
        .map_err(|e| Failure::new(format!("first write refused: {e}")))?;
    let wrong = FencingToken::new(old.fence().get() + 1).expect("above zero");
    ensure!(
        admin
            .force_release_if(&name, wrong, "conformance: wrong fence")
            .await?
            .is_none(),
        "force_release_if with another fence ({wrong}) must evict nobody"
    );
    ensure!(
        a.inspect(&name).await?.map(|h| h.fence) == Some(old.fence()),
        "force_release_if with another fence must leave the holder (fence {}) in place",
        old.fence()
    );
    let evicted = admin
        .force_release_if(&name, old.fence(), "conformance: operator eviction")
        .await?;
    ensure!(
        evicted.as_ref().map(|h| h.fence) == Some(old.fence()),
        "force_release_if should report the evicted holder (fence {}), got {evicted:?}",
        old.fence()
    );
    // Two events per forced release for this name: wait for them, then make
    // sure no more follow.
    let mut seen = Vec::new();
    let give_up = Instant::now() + cx.scaled(Duration::from_millis(500));
    loop {
        match tokio::time::timeout_at(give_up, events.recv()).await {
            Ok(Ok(event)) if event.name == name => seen.push(event),
            Ok(Ok(_)) | Ok(Err(RecvError::Lagged(_))) => continue,
            Ok(Err(RecvError::Closed)) | Err(_) => break,
        }
    }
    let stages: Vec<_> = seen.iter().map(|e| (e.id, e.stage.clone())).collect();
    ensure!(
        seen.len() == 4
            && seen[0].stage == Stage::Requested
            && seen[1].stage == Stage::NothingEvicted
            && seen[2].stage == Stage::Requested
            && matches!(&seen[3].stage, Stage::Evicted(h) if h.fence == old.fence())
            && seen[0].id == seen[1].id
            && seen[2].id == seen[3].id
            && seen[0].id != seen[2].id,
        "expected requested/nothing-evicted then requested/evicted audit events for {name}, got {stages:?}"
    );
    ensure!(
        seen[3].reason.contains("operator eviction") && seen[3].expected_fence == Some(old.fence()),
        "the audit events must carry the reason and the expected fence"
    );
    let renewed = a.renew(&old).await;
    ensure!(
        matches!(renewed, Err(LockError::NotHeld { .. })),
        "the evicted holder's renew must be NotHeld, got {renewed:?}"
    );
    let next = cx.must_acquire(&b, &name, cx.long_ttl()).await?;
    ensure!(
        next.fence() > old.fence(),
        "the next holder's fence {} must exceed {}",
        next.fence(),
        old.fence()
    );
    // A retry of the same compare-and-evict (its reply lost, say) must not
    // evict the next holder.
    ensure!(
        admin
            .force_release_if(&name, old.fence(), "conformance: retried eviction")
            .await?
            .is_none(),
        "a retried force_release_if with the old fence must not evict the next holder"
    );
    ensure!(
        a.release(&old).await? == ReleaseOutcome::NotHeld,
        "the evicted holder's release must be NotHeld"
    );
    ensure!(
        b.inspect(&name).await?.map(|h| h.fence) == Some(next.fence()),
        "the evicted holder must not disturb the next holder"
    );
    resource
        .write(next.fence(), |v| *v += 1)
        .map_err(|e| Failure::new(format!("the new holder's write was refused: {e}")))?;
    ensure!(
        resource.write(old.fence(), |v| *v += 1).is_err(),
        "the evicted holder's late write must be refused"
    );
    ensure!(
        admin
            .force_release(&cx.name("never-held"), "conformance: no-op")
            .await?
            .is_none(),
        "force_release of a free name evicts nobody"
    );
    b.release(&next).await?;
    Ok(Outcome::Passed)
}

/// The lease reports the TTL the store enforces: what `Capabilities`
/// predicts, never less than asked (per-lock leases), and a local deadline
/// counted from the send time, minus the drift margin: with a long TTL the
/// margin is large, so a deadline counted from the reply or without the
/// margin stands out (best of three grants, against scheduling noise).
pub async fn effective_ttl_is_truthful(cx: &Ctx) -> CaseResult {
    let a = cx.client().await?;
    let caps = cx.caps().clone();
    let long = cx.long_ttl();
    let mut best = Duration::MAX;
    for i in 0..3 {
        let name = cx.name(&format!("ttl-long-{i}"));
        let sent = Instant::now();
        let lease = cx.must_acquire(&a, &name, long).await?;
        best = best.min(deadline_overshoot(cx, &lease, sent, Instant::now()));
        a.release(&lease).await?;
    }
    ensure!(
        best.is_zero(),
        "the local deadline of a {long:?} lease lies {best:?} past send time + TTL - drift \
         ({:?}) + half the call, in the best of 3 grants: it must count from the request's \
         send time, with the drift margin",
        Lease::drift(long)
    );
    let base = cx.short_ttl();
    let asks = [
        base,
        base + caps.ttl_granularity / 2 + Duration::from_nanos(1),
        base * 3 / 2,
    ];
    for (i, ask) in asks.into_iter().enumerate() {
        let name = cx.name(&format!("ttl-{i}"));
        let expected = caps.effective_ttl(ask)?.get();
        let lease = cx.must_acquire(&a, &name, ask).await?;
        ensure!(
            lease.ttl().get() == expected,
            "asked {ask:?}: lease says {:?}, capabilities predict {expected:?}",
            lease.ttl()
        );
        if matches!(caps.lease_kind, LeaseKind::PerLock) {
            ensure!(
                lease.ttl().get() >= ask,
                "asked {ask:?} but the store enforces only {:?}",
                lease.ttl()
            );
        }
        // Where the deadline counts from is checked above, on the long TTL
        // whose drift margin leaves room for scheduling (best of three): a
        // short TTL's margin is a few milliseconds, less than a loaded
        // machine puts between this `sent` and the backend's own reading.
        if let Some(left) = a.inspect(&name).await?.and_then(|h| h.expires_in) {
            ensure!(
                left <= lease.ttl().get() + caps.ttl_granularity,
                "the store reports {left:?} left of a {:?} lease",
                lease.ttl()
            );
        }
        a.release(&lease).await?;
    }
    Ok(Outcome::Passed)
}
