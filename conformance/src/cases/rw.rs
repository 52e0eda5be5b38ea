//! Reader-writer locks (`Locker::rw_lock`): readers share, a writer holds
//! alone, a waiting writer is served within the declared bound whatever
//! stream of readers follows it, one fence counter for reads and writes, a
//! crashed holder frees the name, and a writer that gave up leaves nothing.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{CancellationToken, Kind, LockRequest};
use lockcore::{
    Access, Attempt, FencedRwResource, FencingToken, Lease, LockBackend, LockError, LockGuard,
    LockName, ReleaseOutcome,
};
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

mod history;

fn skip_unless_declared(cx: &Ctx) -> Result<(), Outcome> {
    if cx.caps().rw_locks {
        Ok(())
    } else {
        Err(Outcome::Skipped(
            "the backend declares no reader-writer locks".into(),
        ))
    }
}

/// A trait-level request for `access` of the reader-writer lock `name`.
fn request(
    cx: &Ctx,
    name: &LockName,
    ttl: Duration,
    access: Access,
) -> Result<LockRequest, Failure> {
    Ok(cx.request(name, ttl)?.with_access(access))
}

/// A trait-level grant of `access` that must succeed (never renewed: the
/// holder "crashes" unless the case releases it).
async fn must_take(
    cx: &Ctx,
    client: &Arc<dyn LockBackend>,
    name: &LockName,
    ttl: Duration,
    access: Access,
) -> Result<Lease, Failure> {
    match client.try_acquire(&request(cx, name, ttl, access)?).await? {
        Attempt::Acquired(lease) => Ok(lease),
        Attempt::Held { .. } => Err(Failure::new(format!(
            "expected the {access} of free reader-writer lock {name}, but it was held"
        ))),
    }
}

/// Fails if `wrong` is a grant: `who` was granted while `why`.
async fn refused(wrong: Option<LockGuard>, who: &str, why: &str) -> Result<(), Failure> {
    let Some(wrong) = wrong else {
        return Ok(());
    };
    let (name, fence) = (wrong.name(), wrong.fencing_token());
    let _ = wrong.release().await;
    Err(Failure::new(format!(
        "{who} was granted {name} (fence {fence}) while {why}"
    )))
}

/// The holders of the reader-writer lock `name`, as `(access, fence)`, sorted.
async fn holders(
    client: &Arc<dyn LockBackend>,
    name: &LockName,
) -> Result<Vec<(Option<Access>, FencingToken)>, Failure> {
    let mut seen: Vec<_> = (client.holders(name, Kind::ReadWrite).await?)
        .into_iter()
        .map(|h| (h.access, h.fence))
        .collect();
    seen.sort_by_key(|(_, fence)| *fence);
    Ok(seen)
}

/// Two readers hold at once and `holders` shows both as readers; no writer
/// is granted beside them; once they let go a writer is, shown as the
/// writer, and no reader or other writer is granted beside it. Then seven
/// clients read (mostly) and write at random, some crashing (a share taken
/// once and never renewed, on stores with per-lock leases): in the history
/// no write overlaps any other grant, and a grant that ended before another
/// began has the smaller fence (one counter for reads and writes).
pub async fn rw_readers_share_writers_exclude(cx: &Ctx) -> CaseResult {
    if let Err(skipped) = skip_unless_declared(cx) {
        return Ok(skipped);
    }
    let (a, b, c) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let name = cx.name("rw-share");
    let long = cx.long_ttl();
    let (ra, rb) = (
        cx.locker(&a, long).rw_lock(&name)?,
        cx.locker(&b, long).rw_lock(&name)?,
    );
    let writer = cx.locker(&c, long).rw_lock(&name)?;
    let first = ra.read().await?;
    let second = rb
        .try_read()
        .await?
        .ok_or_else(|| Failure::new("a second reader was refused beside the first"))?;
    ensure!(
        first.access() == Some(Access::Read) && second.access() == Some(Access::Read),
        "read guards report {:?} and {:?}",
        first.access(),
        second.access()
    );
    let mut want = vec![
        (Some(Access::Read), first.fencing_token()),
        (Some(Access::Read), second.fencing_token()),
    ];
    want.sort_by_key(|(_, fence)| *fence);
    let seen = holders(&c, &name).await?;
    ensure!(
        seen == want,
        "holders shows {seen:?} for two readers {want:?}"
    );
    refused(writer.try_write().await?, "a writer", "two readers held it").await?;
    first.release().await?;
    second.release().await?;
    let write = writer.write().await?;
    ensure!(
        write.access() == Some(Access::Write),
        "a write guard reports {:?}",
        write.access()
    );
    let seen = holders(&a, &name).await?;
    ensure!(
        seen == vec![(Some(Access::Write), write.fencing_token())],
        "holders shows {seen:?} while one writer holds (fence {})",
        write.fencing_token()
    );
    refused(ra.try_read().await?, "a reader", "a writer held it").await?;
    refused(rb.try_write().await?, "a second writer", "a writer held it").await?;
    write.release().await?;
    history::random_workload(cx).await
}

/// Three readers hold in turn without a gap (each lets go and asks again
/// at once, staggered), then a writer asks: it is granted within the
/// declared bound, the longest hold of the readers it found plus one
/// wake-up, however the stream of readers goes on; no reader that asked
/// after it is granted before it.
pub async fn rw_waiting_writer_is_served_within_bound(cx: &Ctx) -> CaseResult {
    if let Err(skipped) = skip_unless_declared(cx) {
        return Ok(skipped);
    }
    const READERS: usize = 3;
    let name = cx.name("rw-writer-bound");
    let hold = cx.scaled(Duration::from_millis(150));
    // How long the readers go on: far past the bound, so a writer that
    // waits for the stream to end fails.
    let stream = cx.scaled(Duration::from_secs(4));
    let bound = hold + cx.round_trip() * 2 + cx.scaled(Duration::from_millis(100));
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut readers = Vec::new();
    for i in 0..READERS {
        let lock = cx
            .locker(&cx.client().await?, cx.long_ttl())
            .rw_lock(&name)?;
        let offset = hold.mul_f64(i as f64 / READERS as f64);
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            // (when each read was asked, when granted)
            let mut reads = Vec::new();
            while started.elapsed() < stream && !stop.is_cancelled() {
                let asked = Instant::now();
                let guard = tokio::select! {
                    guard = lock.read() => guard?,
                    _ = stop.cancelled() => break,
                };
                reads.push((asked, Instant::now()));
                tokio::time::sleep(hold).await;
                guard.release().await?;
            }
            Ok::<_, LockError>(reads)
        }));
    }
    // The stream is flowing: every reader has had its first share.
    tokio::time::sleep(hold * 2).await;
    let writer = cx
        .locker(&cx.client().await?, cx.long_ttl())
        .rw_lock(&name)?;
    let asked = Instant::now();
    let write = writer.write_timeout(stream).await;
    let waited = asked.elapsed();
    let granted = Instant::now();
    stop.cancel();
    let write = write.map_err(|e| {
        Failure::new(format!(
            "a writer behind a stream of readers was not served within {stream:?}: {e}"
        ))
    })?;
    write.release().await?;
    let mut late = Vec::new();
    for reader in readers {
        for (read_asked, read_granted) in reader
            .await
            .map_err(|e| Failure::new(format!("reader task failed: {e}")))??
        {
            // Asked once the writer was surely waiting, granted before it.
            if read_asked > asked + cx.round_trip() && read_granted < granted {
                late.push(read_granted - asked);
            }
        }
    }
    ensure!(
        waited <= bound,
        "a writer waited {waited:?} behind readers holding {hold:?} each: the bound is {bound:?}"
    );
    ensure!(
        late.is_empty(),
        "{} reads asked after the writer began waiting were granted before it ({late:?} into \
         its wait)",
        late.len()
    );
    Ok(Outcome::Passed)
}

/// Fences come from one counter for reads and writes: a writer's fence is
/// above the reads before it, and the next read's above the write. Through
/// `FencedRwResource`, a read that began before the latest write is
/// refused. On stores with per-lock leases, a writer that stopped renewing
/// loses the name within its TTL to a reader, never before its local
/// deadline, and its late write, renew and release are refused.
pub async fn rw_fences_refuse_stale_holders(cx: &Ctx) -> CaseResult {
    if let Err(skipped) = skip_unless_declared(cx) {
        return Ok(skipped);
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("rw-fences");
    let long = cx.long_ttl();
    let resource = FencedRwResource::new(0_u32);
    let read = must_take(cx, &a, &name, long, Access::Read).await?;
    ensure!(
        resource.read(read.fence(), |v| *v).is_ok(),
        "a first read was refused"
    );
    a.release(&read).await?;
    let write = must_take(cx, &b, &name, long, Access::Write).await?;
    ensure!(
        write.fence() > read.fence(),
        "a write granted after a read has fence {} after {}",
        write.fence(),
        read.fence()
    );
    ensure!(
        resource.write(write.fence(), |v| *v += 1).is_ok(),
        "the writer's write was refused"
    );
    ensure!(
        resource.read(read.fence(), |v| *v).is_err(),
        "a read that began before the latest write (fence {} < {}) was served",
        read.fence(),
        write.fence()
    );
    b.release(&write).await?;
    let next = must_take(cx, &a, &name, long, Access::Read).await?;
    ensure!(
        next.fence() > write.fence(),
        "a read granted after a write has fence {} after {}",
        next.fence(),
        write.fence()
    );
    a.release(&next).await?;
    if !cx.per_lock_leases() {
        return Ok(Outcome::Passed);
    }
    let ttl = cx.short_ttl();
    let stale = must_take(cx, &b, &name, ttl, Access::Write).await?;
    let reader = cx.locker(&a, long).rw_lock(&name)?;
    let fresh = reader
        .read_timeout(cx.freed_within(ttl) + cx.slack(ttl))
        .await
        .map_err(|e| {
            Failure::new(format!(
                "a writer that stopped renewing still blocked a reader past TTL + slack: {e}"
            ))
        })?;
    ensure!(
        Instant::now() >= stale.deadline(),
        "the store freed a write before its holder's local deadline"
    );
    ensure!(
        fresh.fencing_token() > stale.fence(),
        "a read after an expired write has fence {} after {}",
        fresh.fencing_token(),
        stale.fence()
    );
    ensure!(
        resource.read(fresh.fencing_token(), |v| *v).is_ok(),
        "the fresh reader was refused"
    );
    ensure!(
        resource.write(stale.fence(), |v| *v += 1).is_err(),
        "the stale writer's write (fence {}) was accepted after a read with fence {}",
        stale.fence(),
        fresh.fencing_token()
    );
    ensure!(
        matches!(b.renew(&stale).await, Err(LockError::NotHeld { .. })),
        "the stale write must not renew"
    );
    ensure!(
        b.release(&stale).await? == ReleaseOutcome::NotHeld,
        "the stale write's release must report NotHeld"
    );
    fresh.release().await?;
    Ok(Outcome::Passed)
}

/// A reader that died (its share taken once, never renewed) frees the name
/// for a waiting writer within TTL + slack, never before its local
/// deadline; a writer that died frees it for readers the same way.
pub async fn rw_crashed_holder_frees_the_name(cx: &Ctx) -> CaseResult {
    if let Err(skipped) = skip_unless_declared(cx) {
        return Ok(skipped);
    }
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per share");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("rw-crashed");
    let ttl = cx.short_ttl();
    let lock = cx.locker(&b, cx.long_ttl()).rw_lock(&name)?;
    for (dead, next) in [(Access::Read, Access::Write), (Access::Write, Access::Read)] {
        let crashed = must_take(cx, &a, &name, ttl, dead).await?;
        let within = cx.freed_within(ttl) + cx.slack(ttl);
        let taken = match next {
            Access::Read => lock.read_timeout(within).await,
            Access::Write => lock.write_timeout(within).await,
        }
        .map_err(|e| {
            Failure::new(format!(
                "a {dead} whose holder died still blocked a {next} past TTL + slack: {e}"
            ))
        })?;
        ensure!(
            Instant::now() >= crashed.deadline(),
            "the store freed a dead {dead} before its holder's local deadline"
        );
        ensure!(
            taken.fencing_token() > crashed.fence(),
            "the {next} after a dead {dead} has fence {} after {}",
            taken.fencing_token(),
            crashed.fence()
        );
        taken.release().await?;
    }
    Ok(Outcome::Passed)
}

/// A writer that gave up waiting leaves nothing behind: while a reader
/// holds, one writer times out and another's wait is dropped (once its
/// intent shows: new readers are refused); after each, a new reader is
/// granted within a round trip and a clean-up, not a writer's TTL later,
/// and `holders` shows only the readers.
pub async fn rw_writer_that_gave_up_leaves_nothing(cx: &Ctx) -> CaseResult {
    if let Err(skipped) = skip_unless_declared(cx) {
        return Ok(skipped);
    }
    let (a, b, c) = (cx.client().await?, cx.client().await?, cx.client().await?);
    let name = cx.name("rw-gave-up");
    let long = cx.long_ttl();
    let held = cx.locker(&a, long).rw_lock(&name)?.read().await?;
    let writer = cx.locker(&b, long).rw_lock(&name)?;
    let reader = cx.locker(&c, long).rw_lock(&name)?;
    // A leftover intent would block readers for the writer's whole TTL.
    let within = cx.round_trip() * 2 + cx.scaled(Duration::from_secs(2));
    match writer
        .write_timeout(cx.scaled(Duration::from_millis(200)))
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => {
            return Err(Failure::new(format!(
                "a write while a reader held: expected Timeout, got {other:?}"
            )));
        }
    }
    let after_timeout = reader.read_timeout(within).await.map_err(|e| {
        Failure::new(format!(
            "a writer that timed out still kept readers out {within:?} later: {e}"
        ))
    })?;
    after_timeout.release().await?;

    let dropped = tokio::spawn({
        let writer = writer.clone();
        async move { writer.write().await }
    });
    // Its intent is in the store once new readers are refused.
    cx.eventually(
        cx.scaled(Duration::from_secs(10)),
        "the writer waiting",
        || {
            let reader = reader.clone();
            async move {
                Ok(match reader.try_read().await? {
                    Some(guard) => {
                        guard.release().await?;
                        None
                    }
                    None => Some(()),
                })
            }
        },
    )
    .await?;
    dropped.abort();
    let _ = dropped.await;
    let after_drop = reader.read_timeout(within).await.map_err(|e| {
        Failure::new(format!(
            "a writer whose wait was dropped still kept readers out {within:?} later: {e}"
        ))
    })?;
    let seen = holders(&c, &name).await?;
    ensure!(
        seen.iter().all(|(access, _)| *access == Some(Access::Read)) && seen.len() == 2,
        "holders shows {seen:?}: two readers expected, nothing of the writers"
    );
    after_drop.release().await?;
    held.release().await?;
    Ok(Outcome::Passed)
}
