//! S2: release is owner-checked, idempotent, and never touches a later holder.

use lockcore::backend::LockBackendExt;
use lockcore::{Lease, LockError, OwnerToken, ReleaseOutcome};

use crate::{CaseResult, Ctx, Outcome, ensure};

/// A lease with someone else's owner token, or for another name, can neither
/// renew nor release the holder's lock.
pub async fn release_is_owner_checked(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("owned");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let ttl = lease.ttl();
    let forged = Lease::new(
        name.clone(),
        OwnerToken::new(),
        lease.fence(),
        ttl,
        lockcore::backend::Moment::now(),
    );
    let elsewhere = Lease::new(
        cx.name("other"),
        lease.owner(),
        lease.fence(),
        ttl,
        lockcore::backend::Moment::now(),
    );
    for (what, fake) in [
        ("another owner's token", &forged),
        ("a lease of another name", &elsewhere),
    ] {
        for client in [&a, &b] {
            let released = client.release(fake).await?;
            ensure!(
                released == ReleaseOutcome::NotHeld,
                "release with {what} reported {released:?}"
            );
            let renewed = client.renew(fake).await;
            ensure!(
                matches!(renewed, Err(LockError::NotHeld { .. })),
                "renew with {what} should be NotHeld, got {renewed:?}"
            );
        }
    }
    let holder = b.inspect(&name).await?;
    ensure!(
        holder.map(|h| h.fence) == Some(lease.fence()),
        "the holder's lock must survive forged releases"
    );
    ensure!(
        b.inspect(&cx.name("other")).await?.is_none(),
        "a forged renew must not create a lock"
    );
    cx.must_be_held(&b, &name, "forged releases were refused")
        .await?;
    ensure!(
        a.release(&lease).await? == ReleaseOutcome::Released,
        "the owner's release should succeed"
    );
    Ok(Outcome::Passed)
}

/// Releasing twice is harmless, and a stale release never frees the next holder.
pub async fn release_is_idempotent(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("idempotent");
    let first = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    ensure!(
        a.release(&first).await? == ReleaseOutcome::Released,
        "first release should release"
    );
    ensure!(
        a.release(&first).await? == ReleaseOutcome::NotHeld,
        "second release should report NotHeld"
    );
    let second = cx.must_acquire(&b, &name, cx.long_ttl()).await?;
    ensure!(
        second.fence() > first.fence(),
        "fence must grow: {} then {}",
        first.fence(),
        second.fence()
    );
    ensure!(
        a.release(&first).await? == ReleaseOutcome::NotHeld,
        "a stale release must report NotHeld"
    );
    let holder = a.inspect(&name).await?;
    ensure!(
        holder.map(|h| h.fence) == Some(second.fence()),
        "a stale release must not free the next holder's lock"
    );
    let renewed = b.renew(&second).await?;
    ensure!(
        renewed.fence() == second.fence(),
        "renew must keep the fence"
    );
    ensure!(
        b.release(&renewed).await? == ReleaseOutcome::Released,
        "the holder's release should succeed"
    );
    Ok(Outcome::Passed)
}
