//! The fence floor: after a restore from backup, `raise_fence_floor` lifts
//! every fence handed out afterwards above the floor, and never lowers one.

use std::time::Duration;

use lockcore::{FencingToken, LockError};

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

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

/// A floor the store could not count past (within
/// `Capabilities::FENCE_FLOOR_HEADROOM` of `max_fence`) is refused with
/// `InvalidConfig` before any I/O, through the trait and through
/// `admin::raise_fence_floor`, and changes nothing: the next grant's fence
/// is still far below it. (Raising it for real would make every later
/// grant of the shared store fail.)
pub async fn fence_floor_beyond_the_counter_is_refused(cx: &Ctx) -> CaseResult {
    if !cx.caps().fence_floor {
        skip!("the backend declares no fence floor (raise_fence_floor)");
    }
    let (a, admin) = (cx.client().await?, cx.client().await?);
    let max = cx.caps().max_fence_floor();
    ensure!(
        max > 1_000_000_000,
        "the backend declares a largest fence of {} (floor {max}): too small to count",
        cx.caps().max_fence
    );
    let too_high = FencingToken::new(max + 1).expect("above zero");
    let direct = admin.raise_fence_floor(too_high).await;
    ensure!(
        matches!(direct, Err(LockError::InvalidConfig { .. })),
        "raise_fence_floor({too_high}) above the largest floor {max}: expected InvalidConfig, got {direct:?}"
    );
    let audited = lockcore::admin::raise_fence_floor(&*admin, too_high).await;
    ensure!(
        matches!(audited, Err(LockError::InvalidConfig { .. })),
        "admin::raise_fence_floor({too_high}): expected InvalidConfig, got {audited:?}"
    );
    let name = cx.name("floor-refused");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    a.release(&lease).await?;
    ensure!(
        lease.fence().get() < max / 2,
        "a refused floor moved the next fence to {}",
        lease.fence()
    );
    Ok(Outcome::Passed)
}

/// A waiter already queued when the floor is raised (its place in the line
/// taken under the old count) is granted above the floor all the same: a
/// backend whose fence comes from the waiter's queue entry must carry the
/// new floor to every queue with waiters.
pub async fn fence_floor_lifts_a_waiter_queued_before_it(cx: &Ctx) -> CaseResult {
    if !cx.caps().fence_floor {
        skip!("the backend declares no fence floor (raise_fence_floor)");
    }
    let (a, w, admin) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let name = cx.name("floor-waiter");
    let held = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let locker = cx.locker(&w, cx.long_ttl());
    let waiter = tokio::spawn({
        let name = name.clone();
        async move { locker.acquire(&name).await }
    });
    // Let the waiter take its place in the line.
    tokio::time::sleep(cx.scaled(Duration::from_millis(300))).await;
    ensure!(!waiter.is_finished(), "the waiter got a held lock");
    let floor = FencingToken::new(held.fence().get() + 1_000_000).expect("above zero");
    admin.raise_fence_floor(floor).await?;
    a.release(&held).await?;
    let guard = waiter
        .await
        .map_err(|e| Failure::new(format!("waiter task failed: {e}")))??;
    let fence = guard.fencing_token();
    guard.release().await?;
    ensure!(
        fence > floor,
        "a waiter queued before the floor was raised to {floor} was granted fence {fence}"
    );
    Ok(Outcome::Passed)
}
