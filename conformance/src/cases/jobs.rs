//! Run-once jobs (`Locker::job`) and what they stand on,
//! `LockBackend::set_remaining`: `at_least` keeps the name taken after a
//! job that ended early, judged by the store (a client whose clock runs
//! ahead changes nothing); `once_per` skips a run in a completed run's
//! window, on the same clock; a crashed job frees the name at `at_most`; each
//! run gets a larger fence; the remaining time is set exactly and only by
//! its owner.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{Clock, LockBackendExt, Moment};
use lockcore::{
    FencingToken, JobOutcome, Lease, LockBackend, LockError, LockName, Locker, OwnerToken,
};
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// The reason to skip a case that needs `set_remaining`, if it must.
fn why_skip(cx: &Ctx) -> Option<&'static str> {
    (!cx.caps().sets_remaining)
        .then_some("the backend cannot set a lease's remaining time (Capabilities::sets_remaining)")
}

/// A client's clocks set an hour ahead of the real ones, as on a node whose
/// clock is wrong: only its own leases are judged on it.
#[derive(Debug)]
struct AnHourAhead;

impl Clock for AnHourAhead {
    fn now(&self) -> Moment {
        let now = Moment::now();
        let hour = Duration::from_secs(3600);
        Moment::from_parts(now.mono() + hour, now.boot().map(|b| b + hour))
    }
}

/// One run of `name` on `locker` (at most `at_most`, not kept after it
/// ends, at most once per `once_per` if given) that returns its fence:
/// `Some(fence)` if it ran, `None` if skipped.
async fn run_once(
    locker: &Locker,
    name: &LockName,
    at_most: Duration,
    once_per: Option<Duration>,
) -> Result<Option<FencingToken>, Failure> {
    let mut job = locker.job(name)?.at_most(at_most);
    if let Some(window) = once_per {
        job = job.once_per(window);
    }
    match job.run(|fence| async move { fence }).await? {
        JobOutcome::Ran(fence) => Ok(Some(fence)),
        _ => Ok(None),
    }
}

/// A job that ends at once with `at_least` keeps its name taken, on the
/// store's clock: another client's job (whose clock runs an hour ahead) is
/// skipped right after it and just before `at_least` has passed since the
/// grant was asked for, never runs before then, and runs within the TTL
/// bound of `at_least` (plus its drift margin and the TTL granularity)
/// after the first job returned. The first job's lease is renewed on a
/// short TTL, and its client is closed once it returned, so only the store
/// keeping `at_least` can hold the name that long.
pub async fn job_at_least_holds_on_the_stores_clock(cx: &Ctx) -> CaseResult {
    if let Some(why) = why_skip(cx) {
        skip!("{why}");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("at-least");
    let ttl = cx.short_ttl();
    let at_least = ttl * 2 + cx.caps().slack_for(ttl) + cx.round_trip();
    let at_most = cx.long_ttl().max(at_least);
    let first = cx.locker(&a, ttl);
    let skewed = cx.locker(&b, cx.long_ttl()).clock(Arc::new(AnHourAhead));
    let asked = Instant::now();
    let ran = first
        .job(&name)?
        .at_least(at_least)
        .at_most(at_most)
        .run(|fence| async move { fence })
        .await?;
    let returned = Instant::now();
    let JobOutcome::Ran(fence) = ran else {
        return Err(Failure::new(format!(
            "a job of free name {name} was skipped"
        )));
    };
    // Its node goes away as a process that exits would: the store alone
    // keeps the name now.
    first.close().await?;
    for when in [
        "right after the first job ended",
        "just before at_least passed",
    ] {
        if when.starts_with("just") {
            tokio::time::sleep_until(asked + at_least - cx.round_trip()).await;
        }
        let job = skewed.job(&name)?.at_most(at_most);
        match job.run(|f| async move { f }).await? {
            JobOutcome::SkippedHeld { holder } => ensure!(
                holder.as_ref().is_none_or(|h| h.fence == fence),
                "the job was skipped {when}, but the store named holder fence {:?}, not the first job's {fence}",
                holder.map(|h| h.fence)
            ),
            JobOutcome::Ran(next) => {
                return Err(Failure::new(format!(
                    "a second job ran (fence {next}) {when}, {:?} after the first was asked for; at_least is {at_least:?}",
                    asked.elapsed()
                )));
            }
            _ => return Err(Failure::new("an unknown job outcome".to_owned())),
        }
    }
    let next = Next {
        not_before: asked + at_least,
        by: returned + kept_bound(cx, at_least),
        after: fence,
        what: "the first job's at_least",
        once_per: None,
    };
    next.runs(cx, &skewed, &name).await
}

/// How long after the call returned a name kept for `kept` with
/// `set_remaining` is free at the latest: `kept`, the drift margin added to
/// it, the TTL granularity it is rounded up to, the store's slack, a round
/// trip.
fn kept_bound(cx: &Ctx, kept: Duration) -> Duration {
    kept + Lease::drift(kept)
        + cx.caps().ttl_granularity
        + cx.caps().slack_for(kept)
        + cx.round_trip()
}

/// A run of the name that must come after an earlier run ended: not
/// before `not_before`, by `by`, with a fence above `after`.
struct Next {
    not_before: Instant,
    by: Instant,
    after: FencingToken,
    what: &'static str,
    /// The job's `once_per`, if it has one.
    once_per: Option<Duration>,
}

impl Next {
    /// Tries the job on `locker` until it runs, and checks when and with
    /// which fence it did.
    async fn runs(&self, cx: &Ctx, locker: &Locker, name: &LockName) -> CaseResult {
        let what = format!("a second job after {}", self.what);
        let within = self.by.saturating_duration_since(Instant::now());
        let next = cx
            .eventually(within, &what, || async {
                run_once(locker, name, cx.long_ttl(), self.once_per).await
            })
            .await?;
        let ran_at = Instant::now();
        ensure!(
            ran_at >= self.not_before,
            "a second job ran {:?} before the end of {}",
            self.not_before - ran_at,
            self.what
        );
        ensure!(
            next > self.after,
            "fence {next} did not grow past {}",
            self.after
        );
        Ok(Outcome::Passed)
    }
}

/// A job whose process dies mid-run (its future is leaked: nothing
/// releases, nothing renews) holds the name, not renewed, for `at_most`:
/// another client's job is skipped while it holds and runs within the TTL
/// bound of `at_most`, never before `at_most` has passed since it asked.
pub async fn crashed_job_frees_at_at_most(cx: &Ctx) -> CaseResult {
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per lock (covered by the fault cases)");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("crashed-job");
    let at_most = cx.short_ttl();
    let (started, fence) = tokio::sync::oneshot::channel();
    let doomed = cx.locker(&a, cx.long_ttl());
    let asked = Instant::now();
    let job = doomed.job(&name)?.at_most(at_most).renew(false);
    let mut run = Box::pin(job.run(|fence| async move {
        let _ = started.send(fence);
        std::future::pending::<()>().await;
    }));
    let fence = tokio::select! {
        ended = &mut run => {
            return Err(Failure::new(format!("the job that never ends returned {ended:?}")));
        }
        fence = fence => fence.map_err(|_| Failure::new("the job did not start".to_owned()))?,
    };
    // The process dies: its job is never polled, dropped or released again.
    std::mem::forget(run);
    let other = cx.locker(&b, cx.long_ttl());
    tokio::time::sleep_until(asked + at_most / 2).await;
    if Instant::now() + cx.round_trip() < asked + at_most {
        ensure!(
            run_once(&other, &name, cx.long_ttl(), None)
                .await?
                .is_none(),
            "a second job ran while the crashed one's lease of at_most {at_most:?} held"
        );
    }
    let next = Next {
        not_before: asked + at_most,
        by: asked + cx.freed_within(at_most) + cx.caps().ttl_granularity,
        after: fence,
        what: "the crashed job's at_most",
        once_per: None,
    };
    next.runs(cx, &other, &name).await
}

/// With `once_per`, a run that completed is recorded, on the store's
/// clock: a run on another client (whose clock runs an hour ahead) that
/// starts right after it, or just before its window ends, is skipped as
/// done (its record naming the completed run's fence), never runs before
/// the window has passed since the completed run asked for its grant, and
/// runs within the TTL bound of the window after the first returned. The
/// first client is closed once its run returned, so only the store can
/// keep the record that long. A run that fails is not recorded: the
/// completed run starts right after one.
pub async fn job_once_per_window_holds_across_nodes(cx: &Ctx) -> CaseResult {
    if let Some(why) = why_skip(cx) {
        skip!("{why}");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("once-per");
    let ttl = cx.short_ttl();
    let window = ttl * 2 + cx.caps().slack_for(ttl) + cx.round_trip();
    let at_most = cx.long_ttl();
    let first = cx.locker(&a, ttl);
    let skewed = cx.locker(&b, cx.long_ttl()).clock(Arc::new(AnHourAhead));
    let failed = skewed
        .job(&name)?
        .at_most(at_most)
        .once_per(window)
        .try_run(|_| async { Err::<(), _>("failed") })
        .await?;
    ensure!(
        matches!(failed, JobOutcome::Ran(Err("failed"))),
        "a job of free name {name} did not run: {failed:?}"
    );
    let asked = Instant::now();
    let ran = first
        .job(&name)?
        .at_most(at_most)
        .once_per(window)
        .run(|fence| async move { fence })
        .await?;
    let returned = Instant::now();
    let JobOutcome::Ran(fence) = ran else {
        return Err(Failure::new(format!(
            "a run right after a failed one was skipped ({ran:?}): a failed run must not count as done"
        )));
    };
    first.close().await?;
    for when in ["right after the first run", "just before its window ended"] {
        if when.starts_with("just") {
            tokio::time::sleep_until(asked + window - cx.round_trip()).await;
        }
        let job = skewed.job(&name)?.at_most(at_most).once_per(window);
        match job.run(|f| async move { f }).await? {
            JobOutcome::SkippedDone { last } => ensure!(
                last.as_ref().is_some_and(|l| l.fence == fence),
                "skipped {when} as done, but the record named {last:?}, not the run with fence {fence}"
            ),
            other => {
                return Err(Failure::new(format!(
                    "{when}, {:?} after the first run asked and within its window of {window:?}, another run was not skipped as done: {other:?}",
                    asked.elapsed()
                )));
            }
        }
    }
    let next = Next {
        not_before: asked + window,
        by: returned + kept_bound(cx, window),
        after: fence,
        what: "the first run's window",
        once_per: Some(window),
    };
    next.runs(cx, &skewed, &name).await
}

/// Each run of a job, on whichever client, gets a fence larger than every
/// run's before it, and the fence it is given is the one the store holds
/// for it while it runs.
pub async fn job_fence_grows_per_run(cx: &Ctx) -> CaseResult {
    let clients = [cx.client().await?, cx.client().await?];
    let name = cx.name("job-fences");
    let mut last: Option<FencingToken> = None;
    for round in 0..6 {
        let client = &clients[round % clients.len()];
        let locker = cx.locker(client, cx.long_ttl());
        let job = locker.job(&name)?.at_most(cx.long_ttl());
        let name = &name;
        let ran = job
            .run(|fence| async move {
                let held = client.inspect(name).await.map(|h| h.map(|h| h.fence));
                (fence, held)
            })
            .await?;
        let JobOutcome::Ran((fence, held)) = ran else {
            return Err(Failure::new(format!(
                "round {round}: a free job was skipped"
            )));
        };
        ensure!(
            held? == Some(fence),
            "round {round}: the job was given fence {fence}, but the store held another"
        );
        if let Some(prev) = last {
            ensure!(
                fence > prev,
                "round {round}: fence {fence} is not above the previous run's {prev}"
            );
        }
        last = Some(fence);
    }
    Ok(Outcome::Passed)
}

/// `set_remaining` shortens a lease to exactly the time given (freed no
/// sooner than that after the call was sent, and within the TTL bound of
/// it after it returned) and extends one past its TTL (held past its old
/// TTL bound, freed within the new one), keeping the fence; a forged owner
/// or fence, and a stale lease after the name was taken again, are refused
/// with `NotHeld` and change nothing.
pub async fn set_remaining_is_exact_and_owner_checked(cx: &Ctx) -> CaseResult {
    if let Some(why) = why_skip(cx) {
        skip!("{why}");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let short = cx.caps().effective_remaining(cx.short_ttl())?;
    // Shorten a long lease.
    let name = cx.name("shortened");
    let lease = cx.must_acquire(&a, &name, cx.long_ttl()).await?;
    refuses_forgeries(&a, &lease, short).await?;
    let sent = Instant::now();
    let shortened = a.set_remaining(&lease, short).await?;
    let returned = Instant::now();
    ensure!(
        shortened.same_grant(&lease) && shortened.ttl() == short,
        "set_remaining must hand back the same grant with the TTL given ({short}), got fence {} TTL {}",
        shortened.fence(),
        shortened.ttl()
    );
    let next = runs_out(cx, &b, &name, short, (sent, returned), "shortened").await?;
    // The old lease is stale now: refused, and the new holder untouched.
    let stale = a.set_remaining(&lease, short).await;
    ensure!(
        matches!(stale, Err(LockError::NotHeld { .. })),
        "set_remaining of a stale lease should be NotHeld, got {stale:?}"
    );
    cx.must_be_held(&a, &name, "its new holder had not released it")
        .await?;
    b.release(&next).await?;
    // Extend a short lease past its TTL bound.
    let name = cx.name("extended");
    let lease = cx.must_acquire(&a, &name, short.get()).await?;
    let old_bound = cx.freed_within(short.get()) + cx.round_trip();
    let longer = cx.caps().effective_remaining(old_bound * 2)?;
    let sent = Instant::now();
    let extended = a.set_remaining(&lease, longer).await?;
    let returned = Instant::now();
    ensure!(
        extended.same_grant(&lease) && extended.ttl() == longer,
        "set_remaining must hand back the same grant with the TTL given ({longer})"
    );
    tokio::time::sleep_until(returned + old_bound).await;
    cx.must_be_held(&b, &name, "its lease had been extended past its TTL")
        .await?;
    let next = runs_out(cx, &b, &name, longer, (sent, returned), "extended").await?;
    b.release(&next).await?;
    Ok(Outcome::Passed)
}

/// The lease `client` gets of `name` once a lease set to `remaining` (by
/// a call sent and answered at `call`) has run out: no sooner than
/// `remaining` after the call was sent, and within the TTL bound of
/// `remaining` after it was answered.
async fn runs_out(
    cx: &Ctx,
    client: &Arc<dyn LockBackend>,
    name: &LockName,
    remaining: lockcore::backend::Ttl,
    (sent, answered): (Instant, Instant),
    how: &str,
) -> Result<Lease, Failure> {
    let within =
        (answered + cx.freed_within(remaining.get())).saturating_duration_since(Instant::now());
    let what = format!("acquisition after a {how} lease ran out");
    let next = cx
        .eventually(within, &what, || async {
            Ok(client
                .try_acquire_for(name, cx.long_ttl())
                .await?
                .into_lease())
        })
        .await?;
    let got = Instant::now();
    ensure!(
        got >= sent + remaining.get(),
        "a lease {how} to {remaining} was freed {:?} after the call was sent",
        got - sent
    );
    Ok(next)
}

/// A lease of `lease`'s name and fence with another owner, and one of its
/// owner with another fence, are refused with `NotHeld`; `lease` still
/// holds (a renewal of it succeeds).
async fn refuses_forgeries(
    client: &Arc<dyn LockBackend>,
    lease: &Lease,
    remaining: lockcore::backend::Ttl,
) -> Result<(), Failure> {
    let other_fence = FencingToken::new(lease.fence().get() + 1).expect("non-zero");
    let forged = [
        (OwnerToken::new(), lease.fence(), "another owner"),
        (lease.owner(), other_fence, "another fence"),
    ];
    for (owner, fence, what) in forged {
        let forgery = Lease::new(lease.name().clone(), owner, fence, remaining, Moment::now());
        let answer = client.set_remaining(&forgery, remaining).await;
        ensure!(
            matches!(answer, Err(LockError::NotHeld { .. })),
            "set_remaining of a lease with {what} should be NotHeld, got {answer:?}"
        );
    }
    let holder = client.inspect(lease.name()).await?;
    ensure!(
        holder.is_some_and(|h| h.fence == lease.fence()),
        "forged set_remaining calls must leave the holder alone"
    );
    Ok(())
}
