//! Waiting: timeouts within bounds, wake-ups on release, cancellation that
//! leaves nothing behind (C1), and every waiter served.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Backoff, Fairness, LockError};
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Outcome, ensure};

/// `acquire` on a held lock gives up with `Timeout` no earlier than asked and
/// not much later.
pub async fn acquire_times_out_within_bounds(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("timeout");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let wait = cx.scaled(Duration::from_millis(700));
    let started = Instant::now();
    let outcome = cx
        .locker(&b, cx.long_ttl())
        .acquire_timeout(&name, wait)
        .await;
    let took = started.elapsed();
    ensure!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "expected Timeout, got {outcome:?}"
    );
    ensure!(
        took >= wait,
        "gave up after {took:?}, before the {wait:?} asked"
    );
    ensure!(
        took <= wait + cx.slack(Duration::ZERO),
        "gave up after {took:?}, far beyond the {wait:?} asked"
    );
    a.release(&lease).await?;
    Ok(Outcome::Passed)
}

/// A waiter is woken soon after the holder releases: by the store's
/// notification when the backend declares one (re-checks are then set to
/// 30 s, so only a notification can be fast), by short backoff otherwise.
pub async fn waiter_wakes_on_release(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("handoff");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let mut locker = cx.locker(&b, cx.long_ttl());
    if cx.caps().notifications {
        locker = locker
            .recheck(Duration::from_secs(30))
            .backoff(Backoff::new(
                Duration::from_secs(30),
                Duration::from_secs(30),
            ));
    }
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            let guard = locker.acquire(&name).await;
            (guard, Instant::now())
        }
    });
    // Let the waiter start waiting.
    tokio::time::sleep(cx.scaled(Duration::from_millis(300))).await;
    ensure!(!waiter.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    a.release(&lease).await?;
    let (guard, woke) = waiter
        .await
        .map_err(|e| crate::Failure::new(format!("waiter task failed: {e}")))?;
    let guard = guard?;
    let lag = woke - released;
    let bound = cx.scaled(Duration::from_millis(1000));
    ensure!(
        lag <= bound,
        "the waiter took {lag:?} to get a released lock (bound {bound:?}, notifications: {})",
        cx.caps().notifications
    );
    ensure!(
        guard.fencing_token() > lease.fence(),
        "fence must grow on hand-off"
    );
    guard.release().await?;
    Ok(Outcome::Passed)
}

/// A dropped or cancelled acquire returns at once and leaves nothing queued:
/// once the holder releases, a newcomer gets the lock immediately.
pub async fn cancelled_acquire_leaves_nothing(cx: &Ctx) -> CaseResult {
    let (a, b, c, d) = (
        cx.client().await?,
        cx.client().await?,
        cx.client().await?,
        cx.client().await?,
    );
    let name = cx.name("cancelled");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let dropped = tokio::time::timeout(
        cx.scaled(Duration::from_millis(300)),
        cx.locker(&b, cx.long_ttl()).acquire(&name),
    )
    .await;
    ensure!(
        dropped.is_err(),
        "the acquire should still have been waiting: {dropped:?}"
    );
    let cancel = lockcore::backend::CancellationToken::new();
    let canceller = {
        let cancel = cancel.clone();
        let after = cx.scaled(Duration::from_millis(300));
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            cancel.cancel();
        })
    };
    let started = Instant::now();
    let cancelled = cx
        .locker(&c, cx.long_ttl())
        .acquire_cancellable(&name, &cancel)
        .await;
    let _ = canceller.await;
    ensure!(
        matches!(cancelled, Err(LockError::Cancelled { .. })),
        "expected Cancelled, got {cancelled:?}"
    );
    ensure!(
        started.elapsed() <= cx.scaled(Duration::from_millis(300)) + cx.slack(Duration::ZERO),
        "cancellation took {:?}",
        started.elapsed()
    );
    a.release(&lease).await?;
    // Give anything the cancelled waiters left behind (a queue entry, a
    // detached retry) the time to take the lock: it must not.
    tokio::time::sleep(cx.scaled(Duration::from_millis(300))).await;
    let leftover = d.inspect(&name).await?;
    ensure!(
        leftover.is_none(),
        "a cancelled waiter took the lock after giving up: {leftover:?}"
    );
    let next = cx.must_acquire(&d, &name, cx.long_ttl()).await?;
    d.release(&next).await?;
    Ok(Outcome::Passed)
}

/// Eight waiters queue behind a holder; each gets the lock in turn within a
/// bound, with growing fences, in arrival order if the backend promises FIFO.
pub async fn every_waiter_is_served(cx: &Ctx) -> CaseResult {
    const WAITERS: usize = 8;
    let a = cx.client().await?;
    let name = cx.name("queue");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spacing = (cx.round_trip() * 2).max(cx.scaled(Duration::from_millis(50)));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let locker = cx.locker(&cx.client().await?, cx.long_ttl());
        let (name, grants) = (name.clone(), grants.clone());
        let hold = cx.scaled(Duration::from_millis(20));
        tasks.push(tokio::spawn(async move {
            let guard = locker.acquire(&name).await?;
            grants.lock().unwrap().push((i, guard.fencing_token()));
            tokio::time::sleep(hold).await;
            guard.release().await?;
            Ok::<_, LockError>(())
        }));
        // Space arrivals so "arrival order" is well defined: a waiter joins
        // the line within a couple of round trips of its acquire (its first
        // attempt), so two of them apart leave no doubt who came first.
        tokio::time::sleep(spacing).await;
    }
    a.release(&lease).await?;
    for task in tasks {
        task.await
            .map_err(|e| crate::Failure::new(format!("waiter task failed: {e}")))??;
    }
    let grants = grants.lock().unwrap().clone();
    ensure!(
        grants.len() == WAITERS,
        "{} of {WAITERS} waiters were served",
        grants.len()
    );
    ensure!(
        grants.windows(2).all(|w| w[0].1 < w[1].1),
        "fences must grow in grant order: {grants:?}"
    );
    ensure!(
        grants[0].1 > lease.fence(),
        "waiters' fences must exceed the first holder's"
    );
    if cx.caps().fairness == Fairness::Fifo {
        let order: Vec<usize> = grants.iter().map(|g| g.0).collect();
        ensure!(
            order == (0..WAITERS).collect::<Vec<_>>(),
            "the backend promises FIFO but granted in order {order:?}"
        );
    }
    Ok(Outcome::Passed)
}
