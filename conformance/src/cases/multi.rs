//! Multi-locks (`Locker::acquire_all`): every name or none, one fence per
//! name, no deadlock whatever order callers name them in, nothing left
//! behind by a timeout or a cancel, and the whole lost with any member.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError, LockName, Locker, LossReason};
use rand::Rng;
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// Fails unless no client holds any of `names`.
async fn none_held(
    client: &Arc<dyn LockBackend>,
    names: &[&LockName],
    after: &str,
) -> Result<(), Failure> {
    for name in names {
        let holder = client.inspect(name).await?;
        ensure!(holder.is_none(), "{name} was left held {after}: {holder:?}");
    }
    Ok(())
}

/// A client holds `y`: `try_acquire_all([x, y])` gets nothing and leaves
/// `x` free, and so does `acquire_all` running out of time (its `Timeout`
/// names `y`). Once `y` is free, `acquire_all` gets both, each held by the
/// store with the guard's fence (above the earlier holder's for `y`), and
/// nobody else gets either until it releases them.
pub async fn multi_lock_is_all_or_nothing(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let (x, y) = (cx.name("multi-x"), cx.name("multi-y"));
    let (holder, taker) = (cx.locker(&a, cx.long_ttl()), cx.locker(&b, cx.long_ttl()));
    let held = holder.acquire(&y).await?;
    ensure!(
        taker.try_acquire_all([&x, &y]).await?.is_none(),
        "try_acquire_all granted {x} and {y} while another client held {y}"
    );
    none_held(&a, &[&x], "after try_acquire_all found another name held").await?;
    let short = cx.scaled(Duration::from_millis(200));
    match taker.acquire_all_timeout([&y, &x], short).await {
        Err(LockError::Timeout { name, .. }) => ensure!(
            name == y,
            "the multi-lock's timeout names {name}, not {y}, the one held"
        ),
        other => {
            return Err(Failure::new(format!(
                "acquire_all of {x} and {y} while {y} was held: expected Timeout, got {other:?}"
            )));
        }
    }
    none_held(&a, &[&x], "after acquire_all timed out on another name").await?;
    let before = held.fencing_token();
    held.release().await?;
    let both = taker.acquire_all([&y, &x]).await?;
    let mut sorted = vec![x.clone(), y.clone()];
    sorted.sort();
    ensure!(both.names() == sorted, "members {:?}", both.names());
    ensure!(both.is_held(), "a fresh multi-lock must be held");
    for (name, fence) in both.fencing_tokens() {
        let holder = a.inspect(&name).await?.map(|h| h.fence);
        ensure!(
            holder == Some(fence),
            "{name}: the store holds fence {holder:?}, the multi-lock has {fence}"
        );
        cx.must_be_held(&a, &name, "a multi-lock held it").await?;
    }
    let fence_y = both.fencing_token(y.as_str());
    ensure!(
        fence_y.is_some_and(|f| f > before),
        "{y}'s fence {fence_y:?} is not above the earlier holder's {before}"
    );
    both.release().await?;
    none_held(&a, &[&x, &y], "after the multi-lock was released").await?;
    Ok(Outcome::Passed)
}

/// Four clients take overlapping sets of three names, each naming them in
/// its own order (`[a, b]`, `[b, a]`, `[c, b, a]`, `[c]`), eight times each,
/// holding each grant a few milliseconds: every one is served (none waits
/// on another in a cycle), and no name is ever held by two at once.
pub async fn multi_lock_opposite_orders_never_overlap(cx: &Ctx) -> CaseResult {
    const ROUNDS: usize = 8;
    let (a, b, c) = (cx.name("order-a"), cx.name("order-b"), cx.name("order-c"));
    let orders = [
        vec![a.clone(), b.clone()],
        vec![b.clone(), a.clone()],
        vec![c.clone(), b.clone(), a.clone()],
        vec![c.clone()],
    ];
    // A deadlock never ends; this is only how long to wait before saying so.
    let wait = cx.scaled(Duration::from_secs(60));
    let in_use = Arc::new(Mutex::new(HashSet::new()));
    let overlaps = Arc::new(Mutex::new(Vec::new()));
    let hold = cx.scaled(Duration::from_millis(3));
    let mut tasks = Vec::new();
    for order in orders {
        let locker = cx.locker(&cx.client().await?, cx.long_ttl()).max_wait(wait);
        let (in_use, overlaps) = (in_use.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locker.acquire_all(&order).await?;
                {
                    let mut in_use = in_use.lock().unwrap_or_else(|p| p.into_inner());
                    for name in &order {
                        if !in_use.insert(name.clone()) {
                            overlaps
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(format!("{name} granted to {order:?} while held"));
                        }
                    }
                }
                let pause = hold.mul_f64(rand::rng().random_range(0.5..1.5));
                tokio::time::sleep(pause).await;
                in_use
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|n| !order.contains(n));
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        tokio::time::timeout(wait, task)
            .await
            .map_err(|_| {
                Failure::new(format!(
                    "multi-locks naming the same names in other orders were not all served \
                     within {wait:?}: a deadlock"
                ))
            })?
            .map_err(|e| Failure::new(format!("a client's task failed: {e}")))??;
    }
    let overlaps = overlaps.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ensure!(
        overlaps.is_empty(),
        "S1 violated by multi-locks:\n{}",
        overlaps.join("\n")
    );
    Ok(Outcome::Passed)
}

/// A multi-acquire that is cancelled while it waits for its last name, and
/// one that times out, leave nothing behind: the names it had taken are
/// free (within the TTL after the cancel, its guards releasing in the
/// background; at once after the timeout), and once the last name's holder
/// lets go, another client gets it: no leftover waiter takes it.
pub async fn multi_lock_leaves_nothing_behind(cx: &Ctx) -> CaseResult {
    let (a, b, c) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let (x, y, z) = (cx.name("left-x"), cx.name("left-y"), cx.name("left-z"));
    let ttl = cx.short_ttl().max(cx.scaled(Duration::from_secs(2)));
    let ttl = cx.caps().effective_ttl(ttl).map_or(ttl, |t| t.get());
    let freed = ttl + cx.slack(ttl) + cx.round_trip();
    let taker = cx.locker(&b, ttl);
    let held = cx.locker(&a, cx.long_ttl()).acquire(&z).await?;

    let names = [x.clone(), y.clone(), z.clone()];
    let cancelled = tokio::spawn({
        let taker = taker.clone();
        async move { taker.acquire_all(&names).await }
    });
    if cx.caps().atomic_multi {
        // It waits for z holding nothing (`multi_lock_waits_holding_nothing`):
        // give it the time of a few attempts before the cancel.
        tokio::time::sleep(cx.round_trip()).await;
    } else {
        // It holds x and y and waits for z.
        cx.eventually(cx.scaled(Duration::from_secs(10)), "x and y taken", || {
            let (c, x, y) = (c.clone(), x.clone(), y.clone());
            async move {
                let both = c.inspect(&x).await?.is_some() && c.inspect(&y).await?.is_some();
                Ok(both.then_some(()))
            }
        })
        .await?;
    }
    cancelled.abort();
    let _ = cancelled.await;
    cx.eventually(freed, "the cancelled multi-acquire's names freed", || {
        let (c, x, y) = (c.clone(), x.clone(), y.clone());
        async move {
            let free = c.inspect(&x).await?.is_none() && c.inspect(&y).await?.is_none();
            Ok(free.then_some(()))
        }
    })
    .await?;
    held.release().await?;
    let long = cx.long_ttl();
    let next = cx
        .eventually(freed, "the last name free", || {
            let (c, z) = (c.clone(), z.clone());
            async move { Ok(c.try_acquire_for(&z, long).await?.into_lease()) }
        })
        .await
        .map_err(|f| {
            Failure::new(format!(
                "{z} was not free within {freed:?} of its holder's release after a cancelled \
                 multi-acquire waited for it: {}",
                f.0
            ))
        })?;

    let short = cx.scaled(Duration::from_millis(200));
    let limit = short + cx.slack(Duration::ZERO) + cx.round_trip();
    let timed_out = tokio::time::timeout(limit, taker.acquire_all_timeout([&x, &y, &z], short))
        .await
        .map_err(|_| {
            Failure::new(format!(
                "acquire_all_timeout({short:?}) had not returned after {limit:?}"
            ))
        })?;
    ensure!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "expected Timeout while {z} was held, got {timed_out:?}"
    );
    none_held(&c, &[&x, &y], "after a multi-acquire timed out").await?;
    c.release(&next).await?;
    Ok(Outcome::Passed)
}

/// A multi-lock of two names is lost as soon as one member is (a forced
/// release), within the same bound as a single lock: its `lost()` names the
/// member, `is_held()` turns false, and the other member is still released
/// by `release()`.
pub async fn multi_lock_is_lost_with_any_member(cx: &Ctx) -> CaseResult {
    let (a, admin) = (cx.client().await?, cx.client().await?);
    let (x, y) = (cx.name("member-x"), cx.name("member-y"));
    let ttl = cx.short_ttl().max(cx.scaled(Duration::from_secs(2)));
    let ttl = cx.caps().effective_ttl(ttl).map_or(ttl, |t| t.get());
    let every = ttl / 4;
    let both = cx
        .locker(&a, ttl)
        .renew_every(every)
        .acquire_all([&x, &y])
        .await?;
    let (bound, promise) = super::loss::heard_within(cx, ttl, every);
    let token = both.lost_token();
    Locker::from_arc(admin)
        .force_release(&y, "conformance: evict one member")
        .await?;
    let (name, reason) = tokio::time::timeout(bound, both.lost())
        .await
        .map_err(|_| {
            Failure::new(format!(
                "the multi-lock's lost() did not fire within {bound:?} ({promise}) of a forced \
                 release of its member {y}"
            ))
        })?;
    ensure!(
        name == y,
        "lost() names {name}, not {y}, the member evicted"
    );
    ensure!(
        matches!(
            reason,
            LossReason::RenewalRefused | LossReason::StoreReported
        ),
        "unexpected loss reason {reason:?}"
    );
    ensure!(token.is_cancelled(), "lost_token() not cancelled");
    ensure!(
        !both.is_held(),
        "is_held() must be false once a member is lost"
    );
    ensure!(
        matches!(both.ensure_held(), Err(LockError::Lost { .. })),
        "ensure_held() must fail once a member is lost"
    );
    both.release().await?;
    none_held(&a, &[&x], "after the lost multi-lock was released").await?;
    Ok(Outcome::Passed)
}

/// Where the backend takes several locks in one atomic operation
/// (`atomic_multi`), a multi-lock waiting for a held name holds none of
/// the others: they stay free for everyone else the whole time it waits.
/// Once the held name is released, the multi-lock is woken and gets every
/// name at once, each with a fence above the names' earlier holders'.
pub async fn multi_lock_waits_holding_nothing(cx: &Ctx) -> CaseResult {
    if !cx.caps().atomic_multi {
        skip!("the backend takes a multi-lock's names one by one (no atomic_multi)");
    }
    let (a, b, c) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let (x, y, z) = (
        cx.name("atomic-x"),
        cx.name("atomic-y"),
        cx.name("atomic-z"),
    );
    let long = cx.long_ttl();
    let other = cx.locker(&c, long);
    let before_x = other.acquire(&x).await?;
    let last_x = before_x.fencing_token();
    before_x.release().await?;
    let held = cx.locker(&a, long).acquire(&z).await?;
    let waiting = tokio::spawn({
        let (taker, names) = (cx.locker(&b, long), [x.clone(), y.clone(), z.clone()]);
        async move { taker.acquire_all(&names).await }
    });
    // Several attempts' time: x and y stay free, and others take them.
    let looked_until = Instant::now() + cx.round_trip() * 3;
    while Instant::now() < looked_until {
        none_held(&c, &[&x, &y], "while a multi-lock waited for another name").await?;
        let guard = other.try_acquire(&y).await?.ok_or_else(|| {
            Failure::new(format!("{y} was refused while a multi-lock waited for {z}"))
        })?;
        guard.release().await?;
        tokio::time::sleep(cx.scaled(Duration::from_millis(20))).await;
    }
    let last_z = held.fencing_token();
    held.release().await?;
    let within = cx.round_trip() * 2 + cx.scaled(Duration::from_millis(500));
    let all = tokio::time::timeout(within, waiting)
        .await
        .map_err(|_| {
            Failure::new(format!(
                "the multi-lock was not granted within {within:?} of {z}'s release"
            ))
        })?
        .map_err(|e| Failure::new(format!("the multi-lock's task failed: {e}")))??;
    for (name, last) in [(&x, last_x), (&z, last_z)] {
        let fence = all.fencing_token(name.as_str());
        ensure!(
            fence.is_some_and(|f| f > last),
            "{name}: the multi-lock's fence {fence:?} is not above the earlier holder's {last}"
        );
        cx.must_be_held(&c, name, "a multi-lock held it").await?;
    }
    all.release().await?;
    none_held(&c, &[&x, &y, &z], "after the multi-lock was released").await?;
    Ok(Outcome::Passed)
}
