//! Abandoned permits: a permit whose holder stops renewing expires after its
//! TTL on the store's clock, never before the holder's local deadline, and
//! its slot's next holder fences the old one out.

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, FencedSlots, LockError, ReleaseOutcome};
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// A permit holder that stops renewing (paused past its TTL) loses its slot
/// to the next client with a larger fence, never before its local deadline;
/// through `FencedSlots` its late write is refused while the other slot's
/// holder writes on, and its renew and release are refused.
pub async fn stale_slot_holder_is_refused(cx: &Ctx) -> CaseResult {
    if !cx.caps().semaphores {
        skip!("the backend declares no semaphores");
    }
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per permit");
    }
    let (a, b, c) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let name = cx.name("stale-slot");
    let ttl = cx.short_ttl();
    let stale = cx.must_acquire_permit(&a, &name, 2, ttl).await?;
    let other = cx
        .locker(&b, cx.long_ttl())
        .semaphore(&name, 2)?
        .try_acquire()
        .await?
        .ok_or_else(|| Failure::new("the second of two permits was refused"))?;
    let (slot, other_slot) = (slot_of(stale.slot())?, slot_of(other.slot())?);
    ensure!(slot != other_slot, "two holders share slot {slot}");
    let resource = FencedSlots::new(vec![0_u32; 2]);
    let write = |slot, fence| resource.write(slot, fence, |n| *n += 1);
    ensure!(
        write(slot, stale.fence()).is_ok(),
        "a first write was refused"
    );
    let fresh = cx
        .locker(&c, cx.long_ttl())
        .semaphore(&name, 2)?
        .acquire_timeout(ttl + cx.slack(ttl))
        .await
        .map_err(|e| {
            Failure::new(format!(
                "slot {slot}, whose holder stopped renewing, was not granted again within TTL + slack: {e}"
            ))
        })?;
    ensure!(
        Instant::now() >= stale.deadline(),
        "the store freed a permit before its holder's local deadline"
    );
    ensure!(
        fresh.slot() == Some(slot),
        "the only free slot was {slot}, the new holder got {:?}",
        fresh.slot()
    );
    ensure!(
        fresh.fencing_token() > stale.fence(),
        "slot {slot} was granted again with fence {} after fence {}",
        fresh.fencing_token(),
        stale.fence()
    );
    ensure!(
        write(slot, fresh.fencing_token()).is_ok(),
        "the new holder's write was refused"
    );
    ensure!(
        write(slot, stale.fence()).is_err(),
        "the stale holder's write (fence {}) was accepted after the new holder's (fence {})",
        stale.fence(),
        fresh.fencing_token()
    );
    ensure!(
        write(other_slot, other.fencing_token()).is_ok(),
        "the other slot's holder was refused"
    );
    ensure!(
        matches!(a.renew(&stale).await, Err(LockError::NotHeld { .. })),
        "the stale permit must not renew"
    );
    ensure!(
        a.release(&stale).await? == ReleaseOutcome::NotHeld,
        "the stale permit's release must report NotHeld"
    );
    let mut fences: Vec<_> = c
        .inspect_permits(&name)
        .await?
        .iter()
        .map(|h| h.fence)
        .collect();
    fences.sort();
    let mut want = vec![fresh.fencing_token(), other.fencing_token()];
    want.sort();
    ensure!(
        fences == want,
        "inspect_permits shows {fences:?}, the holders have {want:?}"
    );
    fresh.release().await?;
    other.release().await?;
    Ok(Outcome::Passed)
}

/// A permit whose holder died (taken once, never renewed) frees its slot
/// within TTL + the store's slack, never before the holder's local deadline.
pub async fn crashed_permit_holder_frees_its_slot(cx: &Ctx) -> CaseResult {
    if !cx.caps().semaphores {
        skip!("the backend declares no semaphores");
    }
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per permit");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("crashed-permit");
    let ttl = cx.short_ttl();
    let started = Instant::now();
    let crashed = cx.must_acquire_permit(&a, &name, 1, ttl).await?;
    let next_request = cx.request(&name, cx.long_ttl())?;
    tokio::time::sleep_until(started + ttl / 2).await;
    if Instant::now() < crashed.deadline()
        && let Attempt::Acquired(wrong) = b.try_acquire_permit(&next_request, 1).await?
    {
        let _ = b.release(&wrong).await;
        return Err(Failure::new(
            "the only permit was granted twice before its holder's deadline",
        ));
    }
    let within = (started + ttl + cx.slack(ttl)).saturating_duration_since(Instant::now());
    let next = cx
        .eventually(within, "a permit after its holder died", || async {
            Ok(b.try_acquire_permit(&next_request, 1).await?.into_lease())
        })
        .await?;
    ensure!(
        Instant::now() >= crashed.deadline(),
        "the store freed the permit before its holder's local deadline"
    );
    ensure!(
        next.slot() == crashed.slot() && next.fence() > crashed.fence(),
        "slot {:?} (fence {}) came back as slot {:?} with fence {}",
        crashed.slot(),
        crashed.fence(),
        next.slot(),
        next.fence()
    );
    b.release(&next).await?;
    Ok(Outcome::Passed)
}

/// The slot of a permit of a 2-permit semaphore.
fn slot_of(slot: Option<u32>) -> Result<u32, Failure> {
    slot.filter(|s| *s < 2)
        .ok_or_else(|| Failure::new(format!("a permit of 2 was granted slot {slot:?}")))
}
