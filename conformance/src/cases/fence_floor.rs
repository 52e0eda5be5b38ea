//! The fence floor: after a restore from backup, `raise_fence_floor` lifts
//! every fence handed out afterwards above the floor, and never lowers one.

use lockcore::FencingToken;

use crate::{CaseResult, Ctx, Outcome, ensure, skip};

/// After `raise_fence_floor(f)` (from another client) with `f` a million
/// above the current fence, the next grant of a used name, of a never-used
/// name and of a semaphore permit (where the backend has semaphores) all
/// have fences above `f`; raising the floor again to a lower value moves
/// nothing back.
pub async fn fence_floor_lifts_every_grant(cx: &Ctx) -> CaseResult {
    if !cx.caps().fence_floor {
        skip!("the backend declares no fence floor (raise_fence_floor)");
    }
    let (a, admin) = (cx.client().await?, cx.client().await?);
    let (used, fresh) = (cx.name("floor"), cx.name("floor-fresh"));
    let permits = cx.name("floor-permits");
    let before = cx.must_acquire(&a, &used, cx.long_ttl()).await?;
    a.release(&before).await?;
    let floor = FencingToken::new(before.fence().get() + 1_000_000).expect("above zero");
    admin.raise_fence_floor(floor).await?;
    let mut lifted = Vec::new();
    for name in [&used, &fresh] {
        let lease = cx.must_acquire(&a, name, cx.long_ttl()).await?;
        a.release(&lease).await?;
        lifted.push(lease);
    }
    if cx.caps().semaphores {
        let lease = cx
            .must_acquire_permit(&a, &permits, 2, cx.long_ttl())
            .await?;
        a.release(&lease).await?;
        lifted.push(lease);
    }
    for lease in &lifted {
        ensure!(
            lease.fence() > floor,
            "{} was granted fence {} after the floor was raised to {floor}",
            lease.name(),
            lease.fence()
        );
    }
    // A lower floor (a stale runbook run twice) must not move anything back.
    admin.raise_fence_floor(before.fence()).await?;
    let mut again = vec![cx.must_acquire(&a, &used, cx.long_ttl()).await?];
    if cx.caps().semaphores {
        again.push(
            cx.must_acquire_permit(&a, &permits, 2, cx.long_ttl())
                .await?,
        );
    }
    for (lease, earlier) in again.iter().zip([&lifted[0], &lifted[lifted.len() - 1]]) {
        a.release(lease).await?;
        ensure!(
            lease.fence() > earlier.fence(),
            "{} was granted fence {} after fence {}, once a lower floor ({}) was raised",
            lease.name(),
            lease.fence(),
            earlier.fence(),
            before.fence()
        );
    }
    Ok(Outcome::Passed)
}
