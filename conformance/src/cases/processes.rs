//! Cross-process cases: a real client process (the lock-taker, see
//! [`taker`](crate::taker)) holds the lock and is killed or paused, the way
//! a crashed or GC-paused application would be.
//!
//! They need the `stores` feature, a store process another process can reach
//! ([`Factory::store`](crate::Factory::store)) and a taker, which `suite!`
//! tests have and [`run_all`](crate::run_all) has not; otherwise they skip.

pub use imp::*;

#[cfg(not(feature = "stores"))]
mod imp {
    use crate::{CaseResult, Ctx, skip};

    const WHY: &str =
        "cross-process cases need lock-conformance's `stores` feature (lock-taker, signals)";

    /// T2.6 (see the `stores` feature).
    pub async fn killed_holder_frees_the_name(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
    /// T3.8 (see the `stores` feature).
    pub async fn paused_client_is_fenced_out(_cx: &Ctx) -> CaseResult {
        skip!("{WHY}")
    }
}

#[cfg(feature = "stores")]
mod imp {
    use std::time::Duration;

    use lockcore::{FencingToken, LockName};
    use tokio::time::Instant;

    use super::super::faults::{check_takeover, fault_ttl, joined, poll_for, wait_for};
    use crate::taker::{FencedRegister, TakerProcess};
    use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

    /// A taker connected to the factory's store, or why not.
    async fn taker(cx: &Ctx) -> Result<Result<TakerProcess, String>, Failure> {
        let Some(command) = cx.taker() else {
            return Ok(Err(
                "no lock-taker process in this harness (run the suite with suite!, not run_all)"
                    .into(),
            ));
        };
        if cx.store().is_none() {
            return Ok(Err(
                "no store process that a separate client process could reach (Factory::store)"
                    .into(),
            ));
        }
        let env = cx.factory().helper_env();
        TakerProcess::spawn(command, &env, None, cx.scaled(Duration::from_secs(60)))
            .await
            .map(Ok)
            .map_err(|e| Failure::new(format!("cannot start the lock-taker: {e}")))
    }

    fn expect(
        reply: std::io::Result<String>,
        want: &str,
        context: &str,
    ) -> Result<Vec<String>, Failure> {
        let reply = reply.map_err(|e| Failure::new(format!("{context}: {e}")))?;
        let words: Vec<String> = reply.split_whitespace().map(str::to_owned).collect();
        if words.first().map(String::as_str) != Some(want) {
            return Err(Failure::new(format!(
                "{context}: expected `{want} ...`, the taker said `{reply}`"
            )));
        }
        Ok(words)
    }

    fn fence_of(words: &[String], context: &str) -> Result<FencingToken, Failure> {
        words
            .get(1)
            .and_then(|w| w.parse::<u64>().ok())
            .and_then(FencingToken::new)
            .ok_or_else(|| Failure::new(format!("{context}: no fence in {words:?}")))
    }

    async fn take(
        cx: &Ctx,
        taker: &mut TakerProcess,
        name: &LockName,
        ttl: Duration,
    ) -> Result<FencingToken, Failure> {
        let wait = cx.scaled(Duration::from_secs(10));
        let reply = taker
            .command(
                &format!("acquire {} {} {name}", ttl.as_millis(), wait.as_millis()),
                wait + cx.scaled(Duration::from_secs(10)),
            )
            .await;
        let words = expect(reply, "acquired", "taker acquire")?;
        fence_of(&words, "taker acquire")
    }

    /// T2.6: a holder process is killed with `kill -9` while another client
    /// waits. The waiter gets the lock within TTL + slack of the kill (for
    /// session stores, the session timeout, which is their TTL), with a
    /// larger fence.
    pub async fn killed_holder_frees_the_name(cx: &Ctx) -> CaseResult {
        let mut taker = match taker(cx).await? {
            Ok(t) => t,
            Err(why) => skip!("{why}"),
        };
        let b = cx.client().await?;
        let name = cx.name("killed-holder");
        let ttl = fault_ttl(cx);
        let fence_a = take(cx, &mut taker, &name, ttl).await?;
        cx.must_be_held(&b, &name, "the taker process held it")
            .await?;
        let waiter = {
            let (locker, name) = (cx.locker(&b, cx.long_ttl()), name.clone());
            let wait = ttl * 3 + cx.slack(ttl) * 2;
            tokio::spawn(async move {
                let guard = locker.acquire_timeout(&name, wait).await?;
                Ok::<_, lockcore::LockError>((guard, Instant::now()))
            })
        };
        tokio::time::sleep(ttl / 2).await;
        cx.must_be_held(&b, &name, "the taker process held it (and renewed)")
            .await?;
        taker
            .kill()
            .map_err(|e| Failure::new(format!("kill -9 of the taker failed: {e}")))?;
        let killed = Instant::now();
        let (guard, granted) = waiter
            .await
            .map_err(|e| Failure::new(format!("waiter task failed: {e}")))?
            .map_err(|e| {
                Failure::new(format!(
                    "L1: the waiter did not get the lock after the holder was killed: {e}"
                ))
            })?;
        let within = ttl + cx.slack(ttl);
        ensure!(
            granted.saturating_duration_since(killed) <= within,
            "L1: the name stayed blocked {:?} after its holder was killed (bound {within:?})",
            granted - killed
        );
        ensure!(
            guard.fencing_token() > fence_a,
            "F1: fence {} not above the killed holder's {fence_a}",
            guard.fencing_token()
        );
        guard.release().await?;
        Ok(Outcome::Passed)
    }

    /// A lower bound of the taker's local deadline: the time its guard had
    /// left (`status`), counted from when the question was sent. Renewals
    /// after the answer only move the deadline later.
    async fn held_until(
        cx: &Ctx,
        taker: &mut TakerProcess,
        context: &str,
    ) -> Result<Instant, Failure> {
        let asked = Instant::now();
        let reply = taker
            .command("status", cx.scaled(Duration::from_secs(10)))
            .await;
        let words = expect(reply, "held", context)?;
        let left = words
            .get(2)
            .and_then(|w| w.parse::<u64>().ok())
            .ok_or_else(|| Failure::new(format!("{context}: no time left in {words:?}")))?;
        Ok(asked + Duration::from_millis(left))
    }

    /// T3.8, the GC pause: a holder process checks that it holds the lock,
    /// is stopped (`SIGSTOP`) before its write for 3 TTL, another client
    /// takes the lock and writes, and the holder is continued and performs
    /// its pending write. The fenced register refuses it, the holder reports
    /// the loss before its next action, and only the valid writes count.
    ///
    /// From the moment of the pause one client polls `try_acquire` for that
    /// lock, and another waits in `acquire` for a second lock held by a
    /// second holder process paused with it: neither is granted before its
    /// holder's local deadline, and each gets its lock within TTL + declared
    /// slack + a round trip of the pause (the holder's last renewal).
    pub async fn paused_client_is_fenced_out(cx: &Ctx) -> CaseResult {
        let mut taker_a = match taker(cx).await? {
            Ok(t) => t,
            Err(why) => skip!("{why}"),
        };
        let mut taker_w = match taker(cx).await? {
            Ok(t) => t,
            Err(why) => skip!("{why}"),
        };
        let (b, c) = (cx.client().await?, cx.client().await?);
        let register = FencedRegister::start()
            .await
            .map_err(|e| Failure::new(format!("cannot start the fenced register: {e}")))?;
        let name = cx.name("paused-client");
        let waited = cx.name("paused-client-waited");
        let ttl = fault_ttl(cx);
        let reply_within = cx.scaled(Duration::from_secs(10));
        let fence_a = take(cx, &mut taker_a, &name, ttl).await?;
        let fence_w = take(cx, &mut taker_w, &waited, ttl).await?;

        let reply = taker_a
            .command(&format!("write {} 1 0", register.addr()), reply_within)
            .await;
        expect(reply, "writing", "first write")?;
        expect(taker_a.reply(reply_within).await, "written", "first write")?;
        let deadline_a = held_until(cx, &mut taker_a, "status before the pause").await?;
        let deadline_w = held_until(cx, &mut taker_w, "status before the pause").await?;

        // The pending write: checked held, then paused before it writes.
        let pause_before_write = cx.scaled(Duration::from_secs(1));
        let reply = taker_a
            .command(
                &format!(
                    "write {} 2 {}",
                    register.addr(),
                    pause_before_write.as_millis()
                ),
                reply_within,
            )
            .await;
        expect(reply, "writing", "pending write")?;
        taker_a
            .pause()
            .map_err(|e| Failure::new(format!("SIGSTOP of the taker failed: {e}")))?;
        let paused = Instant::now();
        taker_w
            .pause()
            .map_err(|e| Failure::new(format!("SIGSTOP of the second taker failed: {e}")))?;
        let paused_w = Instant::now();

        let bound = cx.freed_within(ttl);
        let give_up = paused + bound * 2 + ttl;
        let poller = poll_for(
            b.clone(),
            name.clone(),
            cx.long_ttl(),
            cx.scaled(Duration::from_millis(10)),
            give_up,
        );
        let waiter = wait_for(cx.locker(&c, cx.long_ttl()), waited.clone(), give_up);
        let taken_b = joined("B", poller).await?;
        let taken_c = joined("C", waiter).await?;
        check_takeover(
            "B (polling try_acquire)",
            &name,
            taken_b.as_ref().map(|t| t.at),
            deadline_a,
            (paused, "its holder was paused"),
            Some(bound),
        )?;
        check_takeover(
            "C (waiting in acquire)",
            &waited,
            taken_c.as_ref().map(|t| t.at),
            deadline_w,
            (paused_w, "its holder was paused"),
            Some(bound),
        )?;
        let (Some(b_took), Some(c_took)) = (taken_b, taken_c) else {
            return Err(Failure::new("a contender got nothing (checked above)"));
        };
        let lease_b = b_took.grant;
        ensure!(
            lease_b.fence() > fence_a,
            "F1: fence {} not above {fence_a}",
            lease_b.fence()
        );
        ensure!(
            c_took.grant.fencing_token() > fence_w,
            "F1: fence {} not above {fence_w}",
            c_took.grant.fencing_token()
        );
        register
            .resource()
            .write(lease_b.fence(), |v| v.push(3))
            .map_err(|e| Failure::new(format!("B's write refused: {e}")))?;

        tokio::time::sleep_until(paused + ttl * 3).await;
        taker_a
            .resume()
            .map_err(|e| Failure::new(format!("SIGCONT of the taker failed: {e}")))?;
        taker_w
            .resume()
            .map_err(|e| Failure::new(format!("SIGCONT of the second taker failed: {e}")))?;
        let reply = taker_a
            .reply(reply_within + pause_before_write)
            .await
            .map_err(|e| Failure::new(format!("pending write: {e}")))?;
        ensure!(
            reply.starts_with("refused"),
            "C1: the paused holder's pending write with fence {fence_a} was not refused after B wrote with {}: {reply}",
            lease_b.fence()
        );
        for (taker, which) in [(&mut taker_a, "first"), (&mut taker_w, "second")] {
            let status = taker
                .command("status", reply_within)
                .await
                .map_err(|e| Failure::new(format!("status: {e}")))?;
            ensure!(
                status.starts_with("lost"),
                "the {which} resumed holder must report its lock lost before its next action, it says `{status}`"
            );
        }
        let values = register.resource().read();
        ensure!(
            values == vec![1, 3],
            "C2: the register holds {values:?}, expected [1, 3]"
        );
        ensure!(
            register.resource().rejected() == 1,
            "{} writes refused, expected exactly the stale one",
            register.resource().rejected()
        );
        b.release(&lease_b).await?;
        c_took.grant.release().await?;
        let _ = taker_a.command("exit", reply_within).await;
        let _ = taker_w.command("exit", reply_within).await;
        Ok(Outcome::Passed)
    }
}
