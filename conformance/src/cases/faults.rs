//! T3: network and store faults. A fault proxy between one client and the
//! store cuts, delays or resets its traffic; a private store is killed or
//! paused. What must hold: a holder's `lost()` fires by its local deadline,
//! nobody else is granted the lock before that deadline, fences keep growing
//! (across a crash too), and the fenced resource refuses the old holder.
//!
//! These cases need the `stores` feature, a factory exposing its store
//! ([`Factory::store`](crate::Factory::store)), proxied clients
//! ([`Factory::client_via`](crate::Factory::client_via)) and, for crash and
//! pause, a private store ([`Factory::private`](crate::Factory::private));
//! without them they skip and say which is missing.

pub use imp::*;

#[cfg(not(feature = "stores"))]
mod imp {
    use crate::{CaseResult, Ctx, skip};

    const WHY: &str =
        "fault cases need lock-conformance's `stores` feature (fault proxy, process control)";

    /// T3.1 (see the `stores` feature).
    pub async fn partitioned_holder_is_fenced_out(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.4 (see the `stores` feature).
    pub async fn slow_renewal_counts_as_lost(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.5 (see the `stores` feature).
    pub async fn reset_mid_hold_keeps_or_reports(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.2 (see the `stores` feature).
    pub async fn lost_acquire_reply_leaves_no_phantom(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.3 (see the `stores` feature).
    pub async fn lost_release_reply_frees_within_ttl(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.6 (see the `stores` feature).
    pub async fn fences_survive_store_crash(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.7 (see the `stores` feature).
    pub async fn store_pause_keeps_invariants(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
}

#[cfg(feature = "stores")]
mod imp {
    use std::sync::Arc;
    use std::time::Duration;

    use lockcore::backend::LockBackendExt;
    use lockcore::{
        Attempt, FenceDurability, FencedResource, Lease, LockBackend, LockError, LockGuard,
        LockName, Locker, ReleaseOutcome,
    };
    use tokio::task::JoinHandle;
    use tokio::time::Instant;

    use crate::history::History;
    use crate::proxy::{FaultProxy, Mode};
    use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

    /// A TTL for fault cases: at least 1 s (scaled), so a renewal interval
    /// leaves room for scheduling on a loaded machine.
    pub(crate) fn fault_ttl(cx: &Ctx) -> Duration {
        let want = cx.short_ttl().max(cx.scaled(Duration::from_secs(1)));
        cx.caps().effective_ttl(want).map_or(want, |t| t.get())
    }

    /// How late after its deadline `lost()` may be observed: timer and
    /// scheduling granularity, not protocol slack.
    pub(crate) fn timer_slack(cx: &Ctx) -> Duration {
        cx.scaled(Duration::from_millis(60))
    }

    /// A proxy in front of the store and a client through it, or why not.
    pub(crate) async fn proxied(
        cx: &Ctx,
    ) -> Result<Result<(FaultProxy, Arc<dyn LockBackend>), String>, Failure> {
        if let Some(why) = cx.factory().no_proxy_reason() {
            return Ok(Err(why));
        }
        let Some(store) = cx.store() else {
            return Ok(Err(
                "no store process to put a proxy in front of (Factory::store)".into(),
            ));
        };
        let proxy = FaultProxy::start(store.addr())
            .await
            .map_err(|e| Failure::new(format!("cannot start a fault proxy: {e}")))?;
        match cx.factory().client_via(proxy.addr()).await {
            None => Ok(Err(
                "the factory cannot connect through a proxy (Factory::client_via)".into(),
            )),
            Some(Err(e)) => Err(Failure::new(format!(
                "cannot connect through the proxy: {e}"
            ))),
            Some(Ok(client)) => Ok(Ok((proxy, client))),
        }
    }

    fn stale_write_refused(
        resource: &FencedResource<Vec<&'static str>>,
        old: lockcore::FencingToken,
        who: &str,
    ) -> Result<(), Failure> {
        match resource.write(old, |v| v.push("stale")) {
            Err(_) => Ok(()),
            Ok(()) => Err(Failure::new(format!(
                "C1: {who}'s write with old fence {old} was accepted after a newer holder wrote"
            ))),
        }
    }

    fn check_history(history: &History) -> Result<(), Failure> {
        let violations = history.check();
        ensure!(
            violations.is_empty(),
            "history violations:\n{}",
            violations.join("\n")
        );
        Ok(())
    }

    /// What a contender got: its grant (a lease or a guard), when it sent
    /// the winning request and when the reply came.
    pub(crate) struct Taken<G> {
        pub(crate) grant: G,
        pub(crate) invoked: Instant,
        pub(crate) at: Instant,
    }

    /// A contender running in its own task: `None` when it gave up.
    pub(crate) type Contender<G> = JoinHandle<Result<Option<Taken<G>>, LockError>>;

    /// Contends for `name` from now until `give_up` by polling `try_acquire`
    /// every `every`.
    pub(crate) fn poll_for(
        client: Arc<dyn LockBackend>,
        name: LockName,
        ttl: Duration,
        every: Duration,
        give_up: Instant,
    ) -> Contender<Lease> {
        tokio::spawn(async move {
            loop {
                let invoked = Instant::now();
                match client.try_acquire_for(&name, ttl).await {
                    Ok(Attempt::Acquired(grant)) => {
                        let at = Instant::now();
                        return Ok(Some(Taken { grant, invoked, at }));
                    }
                    Ok(Attempt::Held { .. }) => {}
                    Err(e) if e.is_retryable() => {}
                    Err(e) => return Err(e),
                }
                if Instant::now() >= give_up {
                    return Ok(None);
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    /// Contends for `name` from now until `give_up` with one waiting
    /// `acquire` through `locker`.
    pub(crate) fn wait_for(
        locker: Locker,
        name: LockName,
        give_up: Instant,
    ) -> Contender<LockGuard> {
        tokio::spawn(async move {
            let invoked = Instant::now();
            let wait = give_up.saturating_duration_since(invoked);
            match locker.acquire_timeout(&name, wait).await {
                Ok(grant) => {
                    let at = Instant::now();
                    Ok(Some(Taken { grant, invoked, at }))
                }
                Err(LockError::Timeout { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// The contender's outcome, once its task ends.
    pub(crate) async fn joined<G>(
        who: &str,
        task: Contender<G>,
    ) -> Result<Option<Taken<G>>, Failure> {
        task.await
            .map_err(|e| Failure::new(format!("{who}'s task failed: {e}")))?
            .map_err(|e| Failure::new(format!("{who}: unexpected error: {e} ({e:?})")))
    }

    /// A contender's grant against the silent holder's: never before the
    /// holder's local `deadline` (S1) and, with `bound`, within `bound` of
    /// `since` (L1), the last moment the store could have extended the
    /// holder's lease.
    pub(crate) fn check_takeover(
        who: &str,
        name: &LockName,
        granted: Option<Instant>,
        deadline: Instant,
        since: (Instant, &str),
        bound: Option<Duration>,
    ) -> Result<(), Failure> {
        let (from, what) = since;
        match (granted, bound) {
            (Some(at), _) if at < deadline => Err(Failure::new(format!(
                "S1: {who} was granted {name} {:?} before the silent holder's local deadline",
                deadline - at
            ))),
            (Some(at), Some(bound)) if at > from + bound => Err(Failure::new(format!(
                "L1: {who} got {name} {:?} after {what}, later than TTL + the declared expiry \
                 slack + a round trip ({bound:?})",
                at - from
            ))),
            (None, Some(bound)) => Err(Failure::new(format!(
                "L1: {who} never got {name}, not even {:?} after {what} (bound {bound:?})",
                from.elapsed()
            ))),
            _ => Ok(()),
        }
    }

    /// Waits for a silent holder's guard to count the lease lost, by its
    /// local deadline; returns when that was and the deadline.
    async fn lost_by_deadline(
        cx: &Ctx,
        guard: &LockGuard,
        ttl: Duration,
        what: &str,
    ) -> Result<(Instant, Instant), Failure> {
        let reason = tokio::time::timeout(ttl + cx.slack(ttl), guard.lost())
            .await
            .map_err(|_| {
                Failure::new(format!(
                    "C6: the holder's lost() did not fire within TTL + slack of {what}"
                ))
            })?;
        let fired = Instant::now();
        let deadline = guard.lease().deadline();
        ensure!(
            fired <= deadline + timer_slack(cx),
            "C6: the holder's lost() ({reason}) fired {:?} after its deadline",
            fired - deadline
        );
        ensure!(!guard.is_held(), "is_held() must be false once lost");
        Ok((fired, deadline))
    }

    /// T3.1: the holder is partitioned (blackhole, no RST) for longer than
    /// its TTL, holding two names. From the moment the partition starts, one
    /// client polls `try_acquire` on the first and another waits in
    /// `acquire` on the second. The holder's `lost()` fires by its local
    /// deadline; neither contender is granted before that deadline, and each
    /// gets its name within TTL + declared slack + a round trip of the
    /// partition; after the partition heals, the old holder's fenced write
    /// is refused and its guards stay lost.
    pub async fn partitioned_holder_is_fenced_out(cx: &Ctx) -> CaseResult {
        let (proxy, a) = match proxied(cx).await? {
            Ok(p) => p,
            Err(why) => skip!("{why}"),
        };
        let (b, c, observer) = (cx.client().await?, cx.client().await?, cx.client().await?);
        let polled = cx.name("partitioned");
        let waited = cx.name("partitioned-waited");
        let ttl = fault_ttl(cx);
        let history = History::new();
        let resource = FencedResource::new(Vec::new());

        let locker = cx.locker(&a, ttl);
        let invoked = Instant::now();
        let guard = locker.acquire(&polled).await?;
        let fence_a = guard.fencing_token();
        let grant_a = history.granted(0, &polled, fence_a, invoked);
        let guard_w = locker.acquire(&waited).await?;
        resource
            .write(fence_a, |v| v.push("a"))
            .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;

        proxy.set(Mode::Blackhole);
        let partitioned = Instant::now();
        let bound = cx.freed_within(ttl);
        let give_up = partitioned + bound * 2 + ttl;
        let poller = poll_for(
            b.clone(),
            polled.clone(),
            cx.long_ttl(),
            cx.scaled(Duration::from_millis(10)),
            give_up,
        );
        let waiter = wait_for(cx.locker(&c, cx.long_ttl()), waited.clone(), give_up);

        let (fired, deadline) = lost_by_deadline(cx, &guard, ttl, "the partition").await?;
        history.end(grant_a, fired.min(deadline));
        let (_, deadline_w) = lost_by_deadline(cx, &guard_w, ttl, "the partition").await?;

        let since = (partitioned, "the partition began");
        let taken_b = joined("B", poller).await?;
        let taken_c = joined("C", waiter).await?;
        check_takeover(
            "B (polling try_acquire)",
            &polled,
            taken_b.as_ref().map(|t| t.at),
            deadline,
            since,
            Some(bound),
        )?;
        check_takeover(
            "C (waiting in acquire)",
            &waited,
            taken_c.as_ref().map(|t| t.at),
            deadline_w,
            since,
            Some(bound),
        )?;
        let (Some(b_took), Some(c_took)) = (taken_b, taken_c) else {
            return Err(Failure::new("a contender got nothing (checked above)"));
        };
        let lease_b = b_took.grant;
        let grant_b = history.granted_at(1, &polled, lease_b.fence(), b_took.invoked, b_took.at);
        ensure!(
            lease_b.fence() > fence_a,
            "F1: B's fence {} is not above A's {fence_a}",
            lease_b.fence()
        );
        ensure!(
            c_took.grant.fencing_token() > guard_w.fencing_token(),
            "F1: C's fence {} is not above A's {}",
            c_took.grant.fencing_token(),
            guard_w.fencing_token()
        );
        resource
            .write(lease_b.fence(), |v| v.push("b"))
            .map_err(|e| Failure::new(format!("B's write refused: {e}")))?;

        proxy.set(Mode::Pass);
        stale_write_refused(&resource, fence_a, "A")?;
        tokio::time::sleep(ttl / 3 + cx.scaled(Duration::from_millis(100))).await;
        ensure!(
            !guard.is_held() && !guard_w.is_held(),
            "A's guard counts a lock held again after the partition healed"
        );
        cx.must_be_held(&observer, &polled, "B held it after the partition healed")
            .await?;
        cx.must_be_held(&observer, &waited, "C held it after the partition healed")
            .await?;
        drop((guard, guard_w));
        history.end(grant_b, Instant::now());
        b.release(&lease_b).await?;
        c_took.grant.release().await?;
        check_history(&history)?;
        Ok(Outcome::Passed)
    }

    /// T3.4: renewal replies are delayed beyond the lease's remaining
    /// validity (the store renews, the client hears too late) while the
    /// holder holds two names, and from that moment one client polls
    /// `try_acquire` on the first and another waits in `acquire` on the
    /// second. The guards count the leases lost at their deadlines and the
    /// late replies do not resurrect them; nobody is granted a name before
    /// its holder's deadline, and with per-lock leases each contender gets
    /// its name within TTL + declared slack + a round trip of the holder's
    /// loss (no renewal reaches the store after it); the old holder's fenced
    /// write is refused.
    pub async fn slow_renewal_counts_as_lost(cx: &Ctx) -> CaseResult {
        let (proxy, a) = match proxied(cx).await? {
            Ok(p) => p,
            Err(why) => skip!("{why}"),
        };
        let (b, c) = (cx.client().await?, cx.client().await?);
        let polled = cx.name("slow-renewal");
        let waited = cx.name("slow-renewal-waited");
        let ttl = fault_ttl(cx);
        let history = History::new();
        let resource = FencedResource::new(Vec::new());

        let locker = cx.locker(&a, ttl);
        let invoked = Instant::now();
        let guard = locker.acquire(&polled).await?;
        let fence_a = guard.fencing_token();
        let grant_a = history.granted(0, &polled, fence_a, invoked);
        let guard_w = locker.acquire(&waited).await?;
        resource
            .write(fence_a, |v| v.push("a"))
            .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;

        proxy.set(Mode::DelayDownstream {
            base: ttl,
            jitter: Duration::ZERO,
        });
        let delayed = Instant::now();
        let bound = cx.freed_within(ttl);
        // A session store may keep the session (and the locks) alive while
        // A's client stays connected: there only safety is checked, and the
        // contenders stop after about the old bound.
        let (bound, give_up) = if cx.per_lock_leases() {
            (Some(bound), delayed + ttl + bound * 2 + ttl)
        } else {
            (None, delayed + ttl + ttl / 3 + cx.slack(ttl))
        };
        let poller = poll_for(
            b.clone(),
            polled.clone(),
            cx.long_ttl(),
            cx.scaled(Duration::from_millis(10)),
            give_up,
        );
        let waiter = wait_for(cx.locker(&c, cx.long_ttl()), waited.clone(), give_up);

        let what = "renewal replies were delayed past the deadline";
        let (fired, deadline) = lost_by_deadline(cx, &guard, ttl, what).await?;
        history.end(grant_a, fired.min(deadline));
        let (fired_w, deadline_w) = lost_by_deadline(cx, &guard_w, ttl, what).await?;
        // Every delayed reply sent so far has arrived by now.
        tokio::time::sleep_until(delayed + ttl + ttl / 2).await;
        ensure!(
            !guard.is_held() && !guard_w.is_held(),
            "a renewal answered after the deadline resurrected the lease (S4)"
        );

        // No renewal is sent after the guard counts the lease lost, so the
        // store's lease ends by then + TTL (+ slack).
        let taken_b = joined("B", poller).await?;
        let taken_c = joined("C", waiter).await?;
        check_takeover(
            "B (polling try_acquire)",
            &polled,
            taken_b.as_ref().map(|t| t.at),
            deadline,
            (fired, "the holder counted its lease lost"),
            bound,
        )?;
        check_takeover(
            "C (waiting in acquire)",
            &waited,
            taken_c.as_ref().map(|t| t.at),
            deadline_w,
            (fired_w, "the holder counted its lease lost"),
            bound,
        )?;
        if let Some(took) = taken_c {
            ensure!(
                took.grant.fencing_token() > guard_w.fencing_token(),
                "F1: C's fence {} is not above A's {}",
                took.grant.fencing_token(),
                guard_w.fencing_token()
            );
            took.grant.release().await?;
        }
        if let Some(took) = taken_b {
            let lease_b = took.grant;
            let grant_b = history.granted_at(1, &polled, lease_b.fence(), took.invoked, took.at);
            resource
                .write(lease_b.fence(), |v| v.push("b"))
                .map_err(|e| Failure::new(format!("B's write refused: {e}")))?;
            stale_write_refused(&resource, fence_a, "A")?;
            history.end(grant_b, Instant::now());
            b.release(&lease_b).await?;
        }
        proxy.set(Mode::Pass);
        drop((guard, guard_w));
        check_history(&history)?;
        Ok(Outcome::Passed)
    }

    /// T3.5: the holder's connections are reset (RST) mid-hold. Either the
    /// client reconnects and keeps the lock (the store still shows it as the
    /// holder and nobody else gets it), or it reports the loss; never both
    /// silently: nobody is granted the lock while the holder's guard still
    /// counts on it (with per-lock leases, not for a moment; a session lock
    /// dies with its connection on both sides, so there a moment is allowed).
    pub async fn reset_mid_hold_keeps_or_reports(cx: &Ctx) -> CaseResult {
        let (proxy, a) = match proxied(cx).await? {
            Ok(p) => p,
            Err(why) => skip!("{why}"),
        };
        let b = cx.client().await?;
        let name = cx.name("reset");
        let ttl = fault_ttl(cx);
        let guard = cx.locker(&a, ttl).acquire(&name).await?;
        let fence_a = guard.fencing_token();
        let lost_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
        let watcher = {
            let (token, lost_at) = (guard.lost_token(), lost_at.clone());
            tokio::spawn(async move {
                token.cancelled().await;
                *lost_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            })
        };

        proxy.reset_existing();
        let until = Instant::now() + ttl * 2 + cx.slack(ttl);
        let mut taken = None;
        while Instant::now() < until {
            match b.try_acquire_for(&name, cx.long_ttl()).await {
                Ok(Attempt::Acquired(lease)) => {
                    // Whether A still counted on the lock when B heard it won.
                    let a_held = guard.is_held();
                    taken = Some((lease, Instant::now(), a_held));
                    break;
                }
                Ok(Attempt::Held { .. }) | Err(_) => {}
            }
            tokio::time::sleep(ttl / 10).await;
        }
        let outcome = match taken {
            None => {
                ensure!(
                    guard.is_held(),
                    "nobody could take the lock for 2 TTL after the reset, yet A's guard says it lost it ({:?})",
                    guard.loss_reason()
                );
                let holder = b.inspect(&name).await?;
                ensure!(
                    holder.as_ref().map(|h| h.fence) == Some(fence_a),
                    "A's guard keeps the lock but the store shows {holder:?}"
                );
                guard.release().await?;
                Outcome::Passed
            }
            Some((lease_b, granted, a_held)) => {
                let deadline = guard.lease().deadline();
                if cx.per_lock_leases() {
                    ensure!(
                        !a_held,
                        "S1: B was granted the lock (fence {}) while A's guard still counted on it \
                         ({:?} before A's deadline; loss: {:?})",
                        lease_b.fence(),
                        deadline.saturating_duration_since(granted),
                        guard.loss_reason()
                    );
                }
                // B got it: A must have reported the loss, by its deadline and
                // (a session lock dies with its connection on both sides at
                // about the same time) no later than a moment after B's grant.
                let reason = tokio::time::timeout(ttl + cx.slack(ttl), guard.lost())
                    .await
                    .map_err(|_| {
                        Failure::new(format!(
                            "B was granted the lock (fence {}) but A's guard never reported the loss",
                            lease_b.fence()
                        ))
                    })?;
                let _ = watcher.await;
                let lost = (*lost_at.lock().unwrap_or_else(|p| p.into_inner()))
                    .ok_or_else(|| Failure::new("loss time not recorded"))?;
                ensure!(
                    lost <= granted + cx.scaled(Duration::from_millis(250)) || deadline <= granted,
                    "A's guard counted on the lock until {:?} after B was granted it ({reason})",
                    lost - granted
                );
                ensure!(lease_b.fence() > fence_a, "F1: fence did not grow");
                b.release(&lease_b).await?;
                drop(guard);
                Outcome::Passed
            }
        };
        drop(proxy);
        Ok(outcome)
    }

    /// T3.2: the reply to an acquire is lost (the store acts on the request,
    /// the client never hears back). The caller gets an error or a timeout,
    /// never a hang; whatever the store granted or queued for it does not
    /// block the name beyond one TTL (+ slack): another client gets the lock
    /// by then, with a larger fence. Once the network heals, the caller's
    /// retry finds the lock held by that client (never granted to both),
    /// and gets it after its release: no deadlock on its own leftovers.
    pub async fn lost_acquire_reply_leaves_no_phantom(cx: &Ctx) -> CaseResult {
        let (proxy, a) = match proxied(cx).await? {
            Ok(p) => p,
            Err(why) => skip!("{why}"),
        };
        let b = cx.client().await?;
        let name = cx.name("acquire-reply-lost");
        let ttl = fault_ttl(cx);
        let before = cx.must_acquire(&b, &name, cx.long_ttl()).await?;
        b.release(&before).await?;

        proxy.set(Mode::DropDownstream);
        let started = Instant::now();
        let blind = tokio::time::timeout(ttl + cx.slack(ttl), a.try_acquire_for(&name, ttl)).await;
        ensure!(
            !matches!(blind, Ok(Ok(_))),
            "try_acquire returned an answer through a proxy that drops every reply: {blind:?}"
        );
        let next = cx
            .eventually(
                (started + ttl + cx.slack(ttl)).saturating_duration_since(Instant::now()),
                "acquisition by another client after an acquire whose reply was lost",
                || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
            )
            .await?;
        ensure!(
            next.fence() > before.fence(),
            "F1: fence {} after the lost reply is not above {}",
            next.fence(),
            before.fence()
        );

        proxy.set(Mode::Pass);
        let healed = cx.scaled(Duration::from_secs(10));
        cx.eventually(
            healed,
            "a definite answer once the network healed",
            || async {
                match a.try_acquire_for(&name, ttl).await {
                    Ok(Attempt::Held { .. }) => Ok(Some(())),
                    Ok(Attempt::Acquired(lease)) => Err(Failure::new(format!(
                        "S1: granted fence {} while another client holds fence {}",
                        lease.fence(),
                        next.fence()
                    ))),
                    Err(e) if e.is_retryable() => Ok(None),
                    Err(e) => Err(Failure::new(format!("after healing: {e}"))),
                }
            },
        )
        .await?;
        b.release(&next).await?;
        let retried = cx
            .eventually(
                healed,
                "the caller's own acquisition after healing",
                || async {
                    match a.try_acquire_for(&name, ttl).await {
                        Ok(attempt) => Ok(attempt.into_lease()),
                        Err(e) if e.is_retryable() => Ok(None),
                        Err(e) => Err(Failure::new(format!("after healing: {e}"))),
                    }
                },
            )
            .await?;
        ensure!(
            retried.fence() > next.fence(),
            "F1: fence {} after healing is not above {}",
            retried.fence(),
            next.fence()
        );
        a.release(&retried).await?;
        Ok(Outcome::Passed)
    }

    /// T3.3: the reply to a release is lost. The caller gets an error or a
    /// timeout, never a hang; the lock is free again within one TTL (+
    /// slack) and the next grant has a larger fence.
    pub async fn lost_release_reply_frees_within_ttl(cx: &Ctx) -> CaseResult {
        let (proxy, a) = match proxied(cx).await? {
            Ok(p) => p,
            Err(why) => skip!("{why}"),
        };
        let b = cx.client().await?;
        let name = cx.name("release-reply-lost");
        let ttl = fault_ttl(cx);
        let lease = cx.must_acquire(&a, &name, ttl).await?;
        proxy.set(Mode::DropDownstream);
        let started = Instant::now();
        // Whatever the answer (an error, a timeout, or Released from a retry on
        // a fresh connection), the lock must be free within TTL + slack.
        let _ = tokio::time::timeout(ttl + cx.slack(ttl), a.release(&lease)).await;
        let next = cx
            .eventually(
                (started + ttl + cx.slack(ttl)).saturating_duration_since(Instant::now()),
                "acquisition after a release whose reply was lost",
                || async { Ok(b.try_acquire_for(&name, cx.long_ttl()).await?.into_lease()) },
            )
            .await?;
        ensure!(next.fence() > lease.fence(), "F1: fence did not grow");
        proxy.set(Mode::Pass);
        b.release(&next).await?;
        Ok(Outcome::Passed)
    }

    /// T3.6: the store is killed with `kill -9` and restarted on the same
    /// data, in its durable configuration. The first fence after the restart
    /// is above the last one before it (F2), and a lock held at the crash is
    /// either still held or re-granted with a larger fence.
    pub async fn fences_survive_store_crash(cx: &Ctx) -> CaseResult {
        if matches!(cx.caps().fence_durability, FenceDurability::Volatile) {
            skip!("the backend declares volatile fences (FenceDurability::Volatile)");
        }
        let (private, store) = match cx.private_store().await? {
            Ok(p) => p,
            Err(why) => skip!("{why}"),
        };
        if !store.durable() {
            skip!("the private store is not in its durable configuration (StoreControl::durable)");
        }
        let c = cx.private_client(&private).await?;
        let name = cx.name("crash");
        let held_name = cx.name("crash-held");
        let mut last = None;
        for round in 0..50 {
            let lease = cx.must_acquire(&c, &name, cx.long_ttl()).await?;
            if let Some(prev) = last {
                ensure!(
                    lease.fence() > prev,
                    "round {round}: fence {} not above {prev}",
                    lease.fence()
                );
            }
            last = Some(lease.fence());
            c.release(&lease).await?;
        }
        let last = last.ok_or_else(|| Failure::new("no grant before the crash"))?;
        let held = cx.must_acquire(&c, &held_name, cx.long_ttl()).await?;

        store
            .kill()
            .await
            .map_err(|e| Failure::new(format!("kill -9 failed: {e}")))?;
        store
            .restart()
            .await
            .map_err(|e| Failure::new(format!("restart failed: {e}")))?;
        let fresh = private
            .client()
            .await
            .map_err(|e| Failure::new(format!("cannot connect after the restart: {e}")))?;
        let first = cx
            .eventually(
                cx.slack(Duration::ZERO) * 5,
                "the first grant after the restart",
                || async {
                    match fresh.try_acquire_for(&name, cx.long_ttl()).await {
                        Ok(attempt) => Ok(attempt.into_lease()),
                        Err(e) if e.is_retryable() => Ok(None),
                        Err(e) => Err(e.into()),
                    }
                },
            )
            .await?;
        ensure!(
            first.fence() > last,
            "F2: first fence after kill -9 + restart is {}, not above the last before, {last}",
            first.fence()
        );
        fresh.release(&first).await?;
        let mut prev = first.fence();
        for round in 0..10 {
            let lease = cx.must_acquire(&fresh, &name, cx.long_ttl()).await?;
            ensure!(
                lease.fence() > prev,
                "round {round} after restart: fence {} not above {prev}",
                lease.fence()
            );
            prev = lease.fence();
            fresh.release(&lease).await?;
        }
        match fresh.try_acquire_for(&held_name, cx.long_ttl()).await? {
            Attempt::Held { .. } => {}
            Attempt::Acquired(lease) => {
                ensure!(
                    lease.fence() > held.fence(),
                    "F2: the lock held at the crash was re-granted with fence {}, not above {}",
                    lease.fence(),
                    held.fence()
                );
                fresh.release(&lease).await?;
            }
        }
        Ok(Outcome::Passed)
    }

    /// T3.7: the store is stopped (`SIGSTOP`) for longer than the TTL while
    /// a holder renews and a waiter waits, then resumed. The holder's
    /// `lost()` fires by its deadline; once resumed the waiter gets the lock
    /// within TTL + slack, after the holder's deadline, with a larger fence;
    /// the old holder's fenced write is refused.
    pub async fn store_pause_keeps_invariants(cx: &Ctx) -> CaseResult {
        let (private, store) = match cx.private_store().await? {
            Ok(p) => p,
            Err(why) => skip!("{why}"),
        };
        let a = cx.private_client(&private).await?;
        let b = cx.private_client(&private).await?;
        let name = cx.name("store-paused");
        let ttl = fault_ttl(cx);
        let history = Arc::new(History::new());
        let resource = FencedResource::new(Vec::new());

        let invoked = Instant::now();
        let guard = cx.locker(&a, ttl).acquire(&name).await?;
        let fence_a = guard.fencing_token();
        let grant_a = history.granted(0, &name, fence_a, invoked);
        resource
            .write(fence_a, |v| v.push("a"))
            .map_err(|e| Failure::new(format!("A's first write refused: {e}")))?;
        let waiter = {
            let (locker, name, history) =
                (cx.locker(&b, cx.long_ttl()), name.clone(), history.clone());
            let wait = cx.scaled(Duration::from_secs(30)) + ttl * 4;
            tokio::spawn(async move {
                let invoked = Instant::now();
                let guard = locker.acquire_timeout(&name, wait).await?;
                let at = history.granted(1, &name, guard.fencing_token(), invoked);
                Ok::<_, lockcore::LockError>((guard, at, Instant::now()))
            })
        };

        store
            .pause()
            .await
            .map_err(|e| Failure::new(format!("SIGSTOP failed: {e}")))?;
        let paused = Instant::now();
        let lost = tokio::time::timeout(ttl + cx.slack(ttl), guard.lost()).await;
        let fired = Instant::now();
        tokio::time::sleep_until(paused + ttl + ttl / 2).await;
        store
            .resume()
            .await
            .map_err(|e| Failure::new(format!("SIGCONT failed: {e}")))?;
        let resumed = Instant::now();
        let reason = lost.map_err(|_| {
            Failure::new(format!(
                "C6: A's lost() did not fire while the store was stopped ({:?} after SIGSTOP; guard: held={}, \
                 deadline in {:?}, loss={:?})",
                fired - paused,
                guard.is_held(),
                guard.lease().deadline().checked_duration_since(Instant::now()),
                guard.loss_reason()
            ))
        })?;
        let deadline = guard.lease().deadline();
        history.end(grant_a, fired.min(deadline));
        ensure!(
            fired <= deadline + timer_slack(cx),
            "C6: A's lost() ({reason}) fired {:?} after its deadline",
            fired - deadline
        );

        let within = ttl + cx.slack(ttl);
        let (guard_b, grant_b, granted) = tokio::time::timeout(within, waiter)
            .await
            .map_err(|_| {
                Failure::new(format!(
                    "L1: the waiter did not get the lock within {within:?} after SIGCONT"
                ))
            })?
            .map_err(|e| Failure::new(format!("waiter task failed: {e}")))??;
        ensure!(
            granted.saturating_duration_since(resumed) <= within,
            "L1: granted {:?} after resume",
            granted - resumed
        );
        ensure!(
            guard_b.fencing_token() > fence_a,
            "F1: fence {} not above A's {fence_a}",
            guard_b.fencing_token()
        );
        resource
            .write(guard_b.fencing_token(), |v| v.push("b"))
            .map_err(|e| Failure::new(format!("B's write refused: {e}")))?;
        stale_write_refused(&resource, fence_a, "A")?;
        history.end(grant_b, Instant::now());
        let released = guard_b.release().await?;
        ensure!(
            released == ReleaseOutcome::Released,
            "B's release: {released:?}"
        );
        drop(guard);
        check_history(&history)?;
        Ok(Outcome::Passed)
    }
}
