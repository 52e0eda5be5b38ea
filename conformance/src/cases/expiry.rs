//! S3 and L1: an abandoned lock frees itself after its TTL on the store's
//! clock, never before the holder's local deadline.

use lockcore::backend::LockBackendExt;
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Outcome, ensure, skip};

/// An abandoned lock is still held at half its TTL and acquirable by another
/// client within TTL + slack, never before the holder's local deadline.
pub async fn expiry_frees_the_name(cx: &Ctx) -> CaseResult {
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per lock (covered by the fault cases)");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("abandoned");
    let ttl = cx.short_ttl();
    let started = Instant::now();
    let lease = cx.must_acquire(&a, &name, ttl).await?;
    tokio::time::sleep_until(started + ttl / 2).await;
    if Instant::now() < lease.deadline() {
        cx.must_be_held(&b, &name, "half of its TTL had passed")
            .await?;
    }
    let next = cx
        .eventually(ttl + cx.slack(ttl), "acquisition after expiry", || async {
            Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease())
        })
        .await?;
    let granted = Instant::now();
    ensure!(
        granted >= lease.deadline(),
        "the store freed the lock {:?} before the holder's local deadline",
        lease.deadline() - granted
    );
    ensure!(
        next.fence() > lease.fence(),
        "fence must grow across expiry"
    );
    b.release(&next).await?;
    Ok(Outcome::Passed)
}

/// A waiter blocked on an abandoned lock gets it once the TTL runs out.
pub async fn waiter_wakes_on_expiry(cx: &Ctx) -> CaseResult {
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per lock (covered by the fault cases)");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("abandoned-waiter");
    let ttl = cx.short_ttl();
    let lease = cx.must_acquire(&a, &name, ttl).await?;
    let waiter = cx.locker(&b, cx.long_ttl());
    let guard = waiter.acquire_timeout(&name, ttl + cx.slack(ttl)).await?;
    ensure!(
        guard.fencing_token() > lease.fence(),
        "fence must grow across expiry"
    );
    ensure!(
        Instant::now() >= lease.deadline(),
        "the waiter got the lock before the holder's local deadline"
    );
    cx.must_be_held(&a, &name, "the waiter held it").await?;
    guard.release().await?;
    Ok(Outcome::Passed)
}
