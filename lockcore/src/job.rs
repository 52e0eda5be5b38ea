//! `Job`: "this scheduled task runs on one node only", on the store's clock.

use std::future::Future;
use std::time::Duration;

use crate::{
    Capabilities, FencingToken, HoldEnd, Holder, LockError, LockGuard, LockName, Locker,
    ReleaseOutcome,
};

mod last_run;

pub use last_run::LastRun;

/// A run-once job: on every node the same schedule fires, one node runs it,
/// the others skip it (they never wait). Made by [`Locker::job`].
///
/// - **`at_most`** (required): the longest the job may hold the name, its
///   crash fail-safe. Renewed (the default), the lease is the locker's TTL
///   (at most `at_most`), renewed in the background until `at_most`, when
///   the hold is lost ([`LossReason::MaxHoldExceeded`](crate::LossReason::MaxHoldExceeded)):
///   a node that dies frees the name after one TTL. With
///   [`renew(false)`](Self::renew), one lease of `at_most`, never renewed: a
///   node that dies holds the name for `at_most`, and the job is lost at
///   that lease's local deadline.
/// - **`at_least`** (default zero): after a job that ends early, the name
///   stays taken until `at_least` has passed since the grant, judged by the
///   store ([`LockGuard::release_no_sooner_than`](crate::LockGuard::release_no_sooner_than)),
///   so a second node, however wrong its clock, cannot run it again in the
///   same window. A run that fails (lost, or the process died) does not
///   hold the name for `at_least`.
/// - **`once_per`** (optional): a run that completes is recorded in the
///   store, and no other run starts until `once_per` has passed since its
///   grant, judged by the store, even on a node that starts minutes later
///   ([`once_per`](Self::once_per)). A run that fails is not recorded.
/// - **The fence is the execution id**: the job gets its grant's fencing
///   token, larger than every earlier run's, to pass to what it writes.
///
/// No wall clock decides anything (a `once_per` record notes its run's end
/// on the node's wall clock, for people to read): elapsed time is measured
/// on the monotonic clock (and the boot clock, so a suspend counts) and expiry is
/// kept by the store, on its clock ([`Capabilities::expiry_clock`](crate::Capabilities::expiry_clock)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use std::time::Duration;
/// use lockcore::{JobOutcome, Locker, MemoryBackend};
///
/// let store = MemoryBackend::new();
/// let (node_a, node_b) = (Locker::new(store.clone()), Locker::new(store));
/// let report = |node: &Locker| -> Result<_, lockcore::LockError> {
///     Ok(node
///         .job("nightly-report")?
///         .at_least(Duration::from_secs(300))
///         .at_most(Duration::from_secs(3600)))
/// };
///
/// // Node A's schedule fires: it runs, fenced with its execution id.
/// let ran = report(&node_a)?.run(|fence| async move { fence.get() }).await?;
/// assert!(matches!(ran, JobOutcome::Ran(id) if id >= 1));
///
/// // Node B's fires a minute later, within A's five minutes: skipped.
/// tokio::time::sleep(Duration::from_secs(60)).await;
/// let skipped = report(&node_b)?.run(|_| async {}).await?;
/// assert!(matches!(skipped, JobOutcome::SkippedHeld { .. }));
///
/// // Five minutes after A's grant (and a drift margin), the name is free.
/// tokio::time::sleep(Duration::from_secs(241)).await;
/// let again = report(&node_b)?.run(|_| async {}).await?;
/// assert!(matches!(again, JobOutcome::Ran(())));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a job does nothing until `run`"]
pub struct Job {
    locker: Locker,
    name: LockName,
    at_most: Option<Duration>,
    at_least: Duration,
    once_per: Option<Duration>,
    renew: bool,
}

/// What [`Job::run`] did (or [`Job::begin`], with the run to drive).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobOutcome<T> {
    /// This node ran the job, which returned this.
    Ran(T),
    /// Another run held the name (running, or within its `at_least`):
    /// skipped, nothing waited.
    SkippedHeld {
        /// Who held it, if the store still said so when asked right after.
        holder: Option<Holder>,
    },
    /// A run completed within the last `once_per` (see
    /// [`Job::once_per`]): skipped, nothing waited.
    SkippedDone {
        /// That run, as its record says (`None` if the record name is held
        /// by something that is not a record).
        last: Option<LastRun>,
    },
}

impl Job {
    pub(crate) fn new(locker: Locker, name: LockName) -> Job {
        Job {
            locker,
            name,
            at_most: None,
            at_least: Duration::ZERO,
            once_per: None,
            renew: true,
        }
    }

    /// The longest the job may hold the name (required): its crash
    /// fail-safe. Renewed, it replaces the locker's [`max_hold`](Locker::max_hold).
    pub fn at_most(mut self, at_most: Duration) -> Self {
        self.at_most = Some(at_most);
        self
    }

    /// How long after its grant the name stays taken when the job ends
    /// early (default zero: released at once). At most `at_most`.
    pub fn at_least(mut self, at_least: Duration) -> Self {
        self.at_least = at_least;
        self
    }

    /// Runs the job at most once per `window`: a run that completes
    /// (its closure returned, [`JobRun::end`]) is recorded in the store,
    /// and every run that starts less than `window` after that run's grant,
    /// judged by the store's clock, is skipped
    /// ([`JobOutcome::SkippedDone`]), however far apart the nodes start and
    /// however wrong their clocks. A run that fails
    /// ([`try_run`](Self::try_run)'s `Err`, [`JobRun::failed`]), is lost or
    /// dies is not recorded: another node may run it in the same window.
    ///
    /// The window is counted from the run's grant, not aligned to the
    /// clock: for a job scheduled every hour, a `once_per` a little under
    /// the hour (55 minutes, say) lets the next hour's run start even if
    /// this one started late. The record is a lock on `NAME#last-run` that
    /// the store frees when the window ends (it lasts as the store's locks
    /// do, across restarts where they do); [`last_run`](Self::last_run)
    /// reads it. Needs a backend that can set a lease's remaining time
    /// ([`Capabilities::sets_remaining`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), lockcore::LockError> {
    /// use std::time::Duration;
    /// use lockcore::{JobOutcome, Locker, MemoryBackend};
    ///
    /// let store = MemoryBackend::new();
    /// let (node_a, node_b) = (Locker::new(store.clone()), Locker::new(store));
    /// let hourly = |node: &Locker| -> Result<_, lockcore::LockError> {
    ///     Ok(node
    ///         .job("hourly-export")?
    ///         .at_most(Duration::from_secs(600))
    ///         .once_per(Duration::from_secs(55 * 60)))
    /// };
    /// let ran = hourly(&node_a)?.run(|fence| async move { fence }).await?;
    /// let JobOutcome::Ran(fence) = ran else { unreachable!() };
    ///
    /// // Node B starts ten minutes late: this window's run is done.
    /// tokio::time::sleep(Duration::from_secs(600)).await;
    /// match hourly(&node_b)?.run(|_| async {}).await? {
    ///     JobOutcome::SkippedDone { last: Some(last) } => assert_eq!(last.fence, fence),
    ///     other => panic!("{other:?}"),
    /// }
    ///
    /// // The next hour's schedule runs again.
    /// tokio::time::sleep(Duration::from_secs(50 * 60)).await;
    /// assert!(matches!(hourly(&node_b)?.run(|_| async {}).await?, JobOutcome::Ran(())));
    /// # Ok(()) }
    /// ```
    pub fn once_per(mut self, window: Duration) -> Self {
        self.once_per = Some(window);
        self
    }

    /// Renew the lease up to `at_most` (default), or hold one lease of
    /// `at_most`, never renewed.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// The job's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The locker a run uses, once the settings are known to be valid.
    fn locker(&self) -> Result<Locker, LockError> {
        let at_most = self.check(&self.locker.backend().capabilities())?;
        let locker = self.locker.clone().auto_renew(self.renew);
        Ok(if self.renew {
            let ttl = self.locker.get_ttl().min(at_most);
            locker.ttl(ttl).max_hold(at_most)
        } else {
            // Its one lease ends the hold at its deadline; nothing releases
            // it before the store frees it.
            locker.ttl(at_most)
        })
    }

    /// `at_most`, once the settings are valid on a backend with
    /// `capabilities`.
    fn check(&self, capabilities: &Capabilities) -> Result<Duration, LockError> {
        let at_most = self.at_most.ok_or_else(|| {
            LockError::config(format!(
                "job \"{}\" needs at_most: the longest it may hold the name",
                self.name
            ))
        })?;
        if at_most.is_zero() {
            return Err(LockError::config(format!(
                "job \"{}\": at_most must be positive",
                self.name
            )));
        }
        if self.at_least > at_most {
            return Err(LockError::config(format!(
                "job \"{}\": at_least {:?} is longer than at_most {at_most:?}",
                self.name, self.at_least
            )));
        }
        if self.once_per.is_some_and(|w| w.is_zero()) {
            return Err(LockError::config(format!(
                "job \"{}\": once_per must be positive",
                self.name
            )));
        }
        if (!self.at_least.is_zero() || self.once_per.is_some()) && !capabilities.sets_remaining {
            return Err(LockError::Unsupported {
                backend: capabilities.backend,
                operation: "set_remaining",
            });
        }
        Ok(at_most)
    }

    /// One attempt to run the job: if the name is free, takes it, runs
    /// `job` with the grant's fencing token, and ends the hold (released,
    /// or kept until `at_least` after the grant: [`JobRun::end`]); if it is
    /// held, skips.
    ///
    /// `job` is stopped (its future dropped) the moment the hold is lost,
    /// as with [`Locker::with_lock`].
    ///
    /// If the store cannot be told to keep the name for `at_least` (a
    /// store error once the job returned), the job still counts as run: a
    /// warning is logged and the name is freed at its lease's own expiry,
    /// which may be sooner.
    ///
    /// # Errors
    /// As [`begin`](Self::begin), or [`LockError::Lost`] if the hold was
    /// lost before `job` completed (including at `at_most`).
    pub async fn run<F, Fut, T>(&self, job: F) -> Result<JobOutcome<T>, LockError>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let run = match self.begin().await? {
            JobOutcome::Ran(run) => run,
            JobOutcome::SkippedHeld { holder } => return Ok(JobOutcome::SkippedHeld { holder }),
            JobOutcome::SkippedDone { last } => return Ok(JobOutcome::SkippedDone { last }),
        };
        let value = run.guard.while_held(job(run.fencing_token())).await?;
        run.finish(true).await;
        Ok(JobOutcome::Ran(value))
    }

    /// [`run`](Self::run) for a job that can fail: an `Err` is not recorded
    /// as a completed run (with [`once_per`](Self::once_per), another node
    /// may run it in the same window); the hold ends as for `Ok`.
    ///
    /// # Errors
    /// As [`run`](Self::run); the job's own error is in
    /// `JobOutcome::Ran(Err(..))`.
    pub async fn try_run<F, Fut, T, E>(&self, job: F) -> Result<JobOutcome<Result<T, E>>, LockError>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let run = match self.begin().await? {
            JobOutcome::Ran(run) => run,
            JobOutcome::SkippedHeld { holder } => return Ok(JobOutcome::SkippedHeld { holder }),
            JobOutcome::SkippedDone { last } => return Ok(JobOutcome::SkippedDone { last }),
        };
        let value = run.guard.while_held(job(run.fencing_token())).await?;
        run.finish(value.is_ok()).await;
        Ok(JobOutcome::Ran(value))
    }

    /// The record of this job's last completed run while its
    /// [`once_per`](Self::once_per) window lasts; `None` once it ended (or
    /// if no run completed).
    ///
    /// # Errors
    /// A store error, or a name too long for its record.
    pub async fn last_run(&self) -> Result<Option<LastRun>, LockError> {
        let holder = self
            .locker
            .inspect(last_run::record_name(&self.name)?)
            .await?;
        Ok(holder.as_ref().and_then(LastRun::from_holder))
    }

    /// Takes the name for one run, as [`run`](Self::run) does, for a
    /// caller that drives the run itself (a supervised process, say):
    /// `Ran(run)` to drive, or why it is skipped (nothing waited). End the
    /// run with [`JobRun::end`] (or [`JobRun::failed`]).
    ///
    /// # Errors
    /// Before any I/O: [`LockError::InvalidConfig`] without `at_most`, with
    /// a zero `at_most` or `once_per`, an `at_least` longer than `at_most`,
    /// or a name too long for its `once_per` record;
    /// [`LockError::Unsupported`] for an `at_least` or a `once_per` on a
    /// backend that cannot set a lease's remaining time
    /// ([`Capabilities::sets_remaining`]); an invalid TTL or renew interval.
    /// Then a store error.
    pub async fn begin(&self) -> Result<JobOutcome<JobRun>, LockError> {
        let locker = self.locker()?;
        let record = match self.once_per {
            Some(window) => Some(Box::new(Record {
                name: last_run::record_name(&self.name)?,
                window,
                locker: self.locker.clone(),
            })),
            None => None,
        };
        let Some(guard) = locker.try_acquire(&self.name).await? else {
            let holder = self.locker.inspect(&self.name).await.unwrap_or_else(|e| {
                tracing::debug!(name = %self.name, error = %e, "job skipped; its holder could not be read");
                None
            });
            tracing::debug!(name = %self.name, fence = ?holder.as_ref().map(|h| h.fence), "job skipped: held");
            return Ok(JobOutcome::SkippedHeld { holder });
        };
        if let Some(record) = &record {
            // Read while holding the name: a run records itself before it
            // lets the name go, so no completed run can be missed here.
            let done = match self.locker.inspect(&record.name).await {
                Ok(done) => done,
                Err(e) => {
                    release_unused(guard).await;
                    return Err(e);
                }
            };
            if let Some(holder) = done {
                release_unused(guard).await;
                let last = LastRun::from_holder(&holder);
                tracing::debug!(name = %self.name, last = ?last.as_ref().map(|l| l.fence), "job skipped: done in this window");
                return Ok(JobOutcome::SkippedDone { last });
            }
        }
        Ok(JobOutcome::Ran(JobRun {
            guard,
            at_least: self.at_least,
            record,
        }))
    }
}

/// Lets a name go that a run took but will not use.
async fn release_unused(guard: LockGuard) {
    if let Err(e) = guard.release().await {
        tracing::debug!(error = %e, "releasing an unused job hold failed; it expires at its TTL");
    }
}

/// Where and for how long a completed run is recorded, and the locker
/// (with its label) that records it.
#[derive(Debug)]
struct Record {
    name: LockName,
    window: Duration,
    locker: Locker,
}

/// One run of a [`Job`], begun with [`Job::begin`]: its hold, renewed (or
/// not) up to `at_most`, lost like any guard's.
#[derive(Debug)]
#[must_use = "dropping a run releases its name at once, whatever its at_least"]
pub struct JobRun {
    guard: LockGuard,
    at_least: Duration,
    record: Option<Box<Record>>,
}

impl JobRun {
    /// The run's hold: check it, watch [`lost`](LockGuard::lost).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The run's execution id: its grant's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The run completed: records it (with [`Job::once_per`]) and ends the
    /// hold, leaving the name taken until `at_least` after the grant
    /// ([`LockGuard::release_no_sooner_than`]), or releasing it without
    /// `at_least`.
    ///
    /// # Errors
    /// A store error; the name is then freed at its lease's expiry. If the
    /// record could not be written, a warning is logged and the hold ends
    /// all the same (another node may run the job in this window).
    pub async fn end(self) -> Result<HoldEnd, LockError> {
        if let Some(record) = &self.record
            && let Err(e) = self.record(record).await
        {
            tracing::warn!(name = %self.guard.name(), error = %e, "the run completed but could not be recorded; another node may run it in this window");
        }
        self.end_hold().await
    }

    /// The run ended without completing: ends the hold as
    /// [`end`](Self::end) does, but records nothing, so with
    /// [`Job::once_per`] another run may start in the same window.
    ///
    /// # Errors
    /// A store error; the name is then freed at its lease's expiry.
    pub async fn failed(self) -> Result<HoldEnd, LockError> {
        self.end_hold().await
    }

    /// Ends the run as `completed` says, logging instead of failing.
    async fn finish(self, completed: bool) {
        let name = self.guard.name();
        let ended = if completed {
            self.end().await
        } else {
            self.failed().await
        };
        match ended {
            Ok(end) => tracing::debug!(%name, ?end, completed, "job ran"),
            Err(e) => {
                tracing::warn!(%name, error = %e, "job ran, but its hold could not be ended as asked; the name is freed at its lease's expiry")
            }
        }
    }

    /// Records this completed run: its record name taken, with the run's
    /// fence, time and node in its label, and left to the store to free
    /// `window` after the run's grant.
    async fn record(&self, record: &Record) -> Result<(), LockError> {
        let took = self.guard.held_for();
        let Some(left) = record.window.checked_sub(took).filter(|d| !d.is_zero()) else {
            return Ok(());
        };
        // The node's wall clock, for people to read in the record only.
        let ended = std::time::SystemTime::now();
        let label = LastRun::label(self.fencing_token(), took, ended, record.locker.get_label());
        let recorder = record.locker.clone().auto_renew(false).label(label);
        match recorder.try_acquire(&record.name).await? {
            Some(kept) => kept.release_no_sooner_than(left).await.map(drop),
            None => {
                tracing::warn!(name = %record.name, "a run's record was already there; kept as it is");
                Ok(())
            }
        }
    }

    /// Ends the hold: kept until `at_least` after the grant, or released.
    async fn end_hold(self) -> Result<HoldEnd, LockError> {
        if !self.at_least.is_zero() {
            return self.guard.release_no_sooner_than(self.at_least).await;
        }
        self.guard.release().await.map(HoldEnd::from)
    }

    /// The run did not happen (it could not start): releases the name at
    /// once, whatever `at_least`.
    ///
    /// # Errors
    /// A store error; the name is then freed at its lease's expiry.
    pub async fn release(self) -> Result<ReleaseOutcome, LockError> {
        self.guard.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    fn job(locker: &Locker) -> Job {
        locker.job("job").unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn bad_settings_are_refused_before_any_io() {
        let locker = Locker::new(MemoryBackend::new());
        let secs = Duration::from_secs;
        for (bad, why) in [
            (job(&locker), "needs at_most"),
            (job(&locker).at_most(Duration::ZERO), "must be positive"),
            (
                job(&locker).at_most(secs(1)).at_least(secs(2)),
                "longer than at_most",
            ),
            (
                job(&locker).at_most(secs(1)).once_per(Duration::ZERO),
                "once_per must be positive",
            ),
        ] {
            let err = bad.run(|_| async {}).await.unwrap_err();
            assert!(
                matches!(&err, LockError::InvalidConfig { message, .. } if message.contains(why)),
                "{err}"
            );
        }
        assert!(locker.inspect("job").await.unwrap().is_none());
        assert!(matches!(locker.job(""), Err(LockError::InvalidName { .. })));
    }

    #[test]
    fn at_least_is_refused_where_the_store_cannot_keep_it() {
        let job = job(&Locker::new(MemoryBackend::new()))
            .at_most(Duration::from_secs(60))
            .at_least(Duration::from_secs(1));
        let err = job.check(&Capabilities::new("elsewhere")).unwrap_err();
        assert!(
            matches!(
                err,
                LockError::Unsupported {
                    backend: "elsewhere",
                    operation: "set_remaining"
                }
            ),
            "{err}"
        );
        let caps = Capabilities::new("elsewhere").sets_remaining(true);
        assert_eq!(job.check(&caps).unwrap(), Duration::from_secs(60));
        let plain = job.at_least(Duration::ZERO);
        assert!(plain.check(&Capabilities::new("elsewhere")).is_ok());
        let once = plain.once_per(Duration::from_secs(60));
        assert!(matches!(
            once.check(&Capabilities::new("elsewhere")),
            Err(LockError::Unsupported { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_past_at_most_is_lost_and_frees_the_name() {
        let store = MemoryBackend::new();
        let (a, b) = (Locker::new(store.clone()), Locker::new(store));
        let at_most = Duration::from_secs(5);
        for renew in [true, false] {
            let started = tokio::time::Instant::now();
            let err = job(&a)
                .at_most(at_most)
                .renew(renew)
                .run(|_| std::future::pending::<()>())
                .await
                .unwrap_err();
            assert!(matches!(err, LockError::Lost { .. }), "{err}");
            assert!(started.elapsed() <= at_most, "renew {renew}");
            // Renewed: the cap released it; not renewed: its one lease runs
            // out within its drift margin.
            tokio::time::sleep(crate::Lease::drift(at_most)).await;
            let next = job(&b).at_most(at_most).run(|f| async move { f }).await;
            assert!(
                matches!(next, Ok(JobOutcome::Ran(_))),
                "renew {renew}: {next:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn once_per_records_completed_runs_only_until_their_window_ends() {
        let store = MemoryBackend::new();
        let (a, b) = (Locker::new(store.clone()), Locker::new(store));
        let window = Duration::from_secs(600);
        let hourly = |l: &Locker| job(l).at_most(Duration::from_secs(60)).once_per(window);
        // A failed run leaves no record: the next one runs at once.
        let failed = hourly(&a).try_run(|_| async { Err::<(), _>("no") }).await;
        assert!(
            matches!(failed, Ok(JobOutcome::Ran(Err("no")))),
            "{failed:?}"
        );
        assert_eq!(hourly(&b).last_run().await.unwrap(), None);
        let ran = hourly(&a).run(|f| async move { f }).await.unwrap();
        let JobOutcome::Ran(fence) = ran else {
            panic!("{ran:?}")
        };
        let last = hourly(&b).last_run().await.unwrap().expect("recorded");
        assert_eq!(
            (last.fence, last.by.as_str()),
            (fence, a.get_label().as_str())
        );
        assert!(
            last.window_left
                .is_some_and(|left| left <= window + crate::Lease::drift(window))
        );
        // Skipped on the other node until the window ends, not after.
        tokio::time::sleep(window - Duration::from_secs(1)).await;
        let skipped = hourly(&b).run(|_| async {}).await.unwrap();
        assert!(
            matches!(&skipped, JobOutcome::SkippedDone { last: Some(l) } if l.fence == fence),
            "{skipped:?}"
        );
        tokio::time::sleep(Duration::from_secs(1) + crate::Lease::drift(window)).await;
        let next = hourly(&b).run(|f| async move { f }).await.unwrap();
        assert!(matches!(next, JobOutcome::Ran(f) if f > fence), "{next:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn without_at_least_the_name_is_free_at_once_and_fences_grow() {
        let locker = Locker::new(MemoryBackend::new());
        let mut last = 0;
        for _ in 0..3 {
            let run = job(&locker).at_most(Duration::from_secs(60));
            let JobOutcome::Ran(fence) = run.run(|f| async move { f.get() }).await.unwrap() else {
                panic!("skipped a free job");
            };
            assert!(fence > last);
            last = fence;
        }
    }
}
