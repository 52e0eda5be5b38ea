//! S1: one holder per name, names independent, no reentrancy.

use crate::{CaseResult, Ctx, Outcome, ensure};
use lockcore::backend::LockBackendExt;

/// A held name cannot be taken by another client, nor again by its holder.
pub async fn exclusive_between_clients(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("exclusive");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    ensure!(
        lease.fence().get() >= 1,
        "fencing tokens start at 1, got {}",
        lease.fence()
    );
    cx.must_be_held(&b, &name, "another client held it").await?;
    cx.must_be_held(
        &a,
        &name,
        "the same client held it (locks are not reentrant)",
    )
    .await?;
    let holder = b.inspect(&name).await?;
    ensure!(
        holder.as_ref().map(|h| h.fence) == Some(lease.fence()),
        "inspect from another client should show fence {}, got {holder:?}",
        lease.fence()
    );
    ensure!(
        a.release(&lease).await? == lockcore::ReleaseOutcome::Released,
        "release of a held lock should report Released"
    );
    Ok(Outcome::Passed)
}

/// Holding one name blocks no other, and names are case-sensitive.
pub async fn independent_names(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let (one, two) = (cx.name("one"), cx.name("two"));
    let (upper, lower) = (cx.name("Case"), cx.name("case"));
    let l1 = cx.must_acquire(&a, &one, cx.long_ttl()).await?;
    let l2 = cx.must_acquire(&b, &two, cx.long_ttl()).await?;
    cx.must_be_held(&a, &two, "b held it").await?;
    cx.must_be_held(&b, &one, "a held it").await?;
    let l3 = cx.must_acquire(&a, &upper, cx.long_ttl()).await?;
    let l4 = cx.must_acquire(&b, &lower, cx.long_ttl()).await?;
    for (client, lease) in [(&a, &l1), (&b, &l2), (&a, &l3), (&b, &l4)] {
        client.release(lease).await?;
    }
    Ok(Outcome::Passed)
}
