//! T3.11 of the test plan: a Jepsen-style nemesis. Six clients, each behind
//! its own fault proxy, run the random workload of
//! [`random_workload_history_is_clean`](super::concurrency::random_workload_history_is_clean)
//! (try-acquire, waiting acquire, renew, fenced write, release, abandon) on
//! two names for 8 s (scaled; 4 TTLs if longer, so a backend with long
//! leases, like ZooKeeper's session timeout, still sees several grant
//! cycles), while a nemesis keeps picking one client's proxy
//! and cutting, freezing, resetting, half-dropping or delaying its traffic
//! for 0.2 to 2 TTLs before healing it. Only the clients' links are hurt:
//! the store (shared with other cases) is never paused or killed here.
//!
//! What must hold:
//! - **safety, always**: the recorded history has fences in real-time order
//!   and no two grants of one name counted on at once (S1, F1); no fenced
//!   write is refused while its writer still held a valid lease (before its
//!   local deadline); no renewal or release sent before the deadline is
//!   answered "not held". A store call that times out or fails with a
//!   retryable error is an unknown outcome: never recorded as a grant.
//! - **liveness, once healed**: every client's task ends within its calls'
//!   bounds (no call hangs), and each name is then acquirable by a fresh,
//!   healthy client within TTL + slack (+ 3 s), with a fence above every
//!   fence recorded for it; the workload made the progress the backend's
//!   declarations promise: per name, one grant per "longest fault + twice
//!   (TTL + declared expiry slack + a round trip)" of the run, at least one.
//!
//! The fault schedule and each client's choice of operations come from one
//! seed, printed in every failure. To replay a run (same schedule, same
//! operation choices; timing and interleaving still vary):
//!
//! ```sh
//! LOCK_TEST_NEMESIS_SEED=<seed> cargo test -p lock-redis --test conformance -- nemesis
//! ```
//!
//! Needs the `stores` feature, a factory exposing its store and able to
//! connect through a proxy; otherwise it skips and says which is missing.

pub use imp::*;

#[cfg(not(feature = "stores"))]
mod imp {
    use crate::{CaseResult, Ctx, skip};

    /// T3.11 (see the `stores` feature).
    pub async fn nemesis_history_is_clean(_cx: &Ctx) -> CaseResult {
        skip!("the nemesis case needs lock-conformance's `stores` feature (fault proxy)")
    }
}

#[cfg(feature = "stores")]
mod imp {
    use std::sync::Arc;
    use std::time::Duration;

    use lockcore::backend::LockBackendExt;
    use lockcore::{FencedResource, LockBackend};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use tokio::time::Instant;

    use super::super::concurrency::{Workload, spawn_random_clients};
    use super::super::faults::{fault_ttl, proxied};
    use crate::history::History;
    use crate::kit::proxy::{FaultProxy, Mode};
    use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

    /// Clients, each behind its own proxy.
    const CLIENTS: usize = 6;
    /// Lock names they share.
    const NAMES: usize = 2;
    /// The variable that fixes the seed, to replay a run.
    const SEED_ENV: crate::kit::env::Var = crate::kit::env::NEMESIS_SEED;

    /// The seed: `LOCK_TEST_NEMESIS_SEED` (decimal or `0x` hex) if set, else
    /// random.
    fn seed() -> Result<u64, Failure> {
        let Some(text) = SEED_ENV.get() else {
            return Ok(rand::random());
        };
        let text = text.as_str();
        let parsed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        };
        parsed.map_err(|e| Failure::new(format!("{SEED_ENV}={text:?} is not a u64: {e}")))
    }

    /// One random fault.
    fn fault(rng: &mut StdRng) -> Mode {
        let delay = |rng: &mut StdRng| {
            let base = Duration::from_millis(rng.random_range(50..=300));
            (base, base.mul_f64(rng.random_range(0.0..=1.0)))
        };
        match rng.random_range(0..7) {
            0 => Mode::Blackhole,
            1 => Mode::Freeze,
            2 => Mode::Reset,
            3 => Mode::DropDownstream,
            4 => Mode::DropUpstream,
            5 => {
                let (base, jitter) = delay(rng);
                Mode::Delay { base, jitter }
            }
            _ => {
                let (base, jitter) = delay(rng);
                Mode::DelayDownstream { base, jitter }
            }
        }
    }

    /// The fewest grants a run of `run` must make, from what the backend
    /// declares and the faults it met. After a grant a name may stay blocked
    /// for as long as its holder is cut off (`longest_fault` of the
    /// schedule) plus, twice, what the store takes to free a silent holder
    /// (TTL, or the session timeout, + declared expiry slack + a round trip):
    /// once for the holder, once for a waiter the store granted while its
    /// link was down (its reply lost). So each name is granted at least once
    /// per such cycle, and at least once in all: the links start healthy.
    fn min_grants(cx: &Ctx, ttl: Duration, run: Duration, longest_fault: Duration) -> usize {
        let cycle = longest_fault + cx.freed_within(ttl) * 2;
        let per_name = (run.as_secs_f64() / cycle.as_secs_f64()).floor().max(1.0);
        NAMES * per_name as usize
    }

    /// Every 0.3–1 × `ttl` until `until`, puts one random proxy in a random
    /// fault for 0.2–2 × `ttl`, healing each when its time is up; then heals
    /// them all. Returns the schedule, for failure messages, and the longest
    /// fault.
    async fn nemesis(
        proxies: &[FaultProxy],
        mut rng: StdRng,
        ttl: Duration,
        until: Instant,
    ) -> (Vec<String>, Duration) {
        let start = Instant::now();
        let mut longest = Duration::ZERO;
        let mut log = Vec::new();
        let mut heal_at: Vec<Option<Instant>> = vec![None; proxies.len()];
        // 0.3–1 TTL apart: the same fault density whatever the backend's TTL
        // (fault durations scale with it too).
        let gap =
            |rng: &mut StdRng| ttl.mul_f64(f64::from(rng.random_range(300_u32..=1000)) / 1000.0);
        let mut next = start + gap(&mut rng);
        loop {
            let wake = heal_at
                .iter()
                .flatten()
                .fold(next.min(until), |at, heal| at.min(*heal));
            tokio::time::sleep_until(wake).await;
            let now = Instant::now();
            for (i, heal) in heal_at.iter_mut().enumerate() {
                if heal.is_some_and(|at| at <= now) {
                    proxies[i].set(Mode::Pass);
                    *heal = None;
                    log.push(format!("{:>8.2?} client {i}: healed", now - start));
                }
            }
            if now >= until {
                break;
            }
            if now >= next {
                let i = rng.random_range(0..proxies.len());
                let mode = fault(&mut rng);
                let hold = ttl.mul_f64(rng.random_range(0.2..=2.0));
                longest = longest.max(hold.min(until.saturating_duration_since(now)));
                proxies[i].set(mode);
                heal_at[i] = Some(now + hold);
                log.push(format!(
                    "{:>8.2?} client {i}: {mode:?} for {hold:.2?}",
                    now - start
                ));
                next = now + gap(&mut rng);
            }
        }
        for proxy in proxies {
            proxy.set(Mode::Pass);
        }
        log.push(format!(
            "{:>8.2?} all healed",
            Instant::now().duration_since(start)
        ));
        (log, longest)
    }

    /// T3.11: see the module documentation.
    pub async fn nemesis_history_is_clean(cx: &Ctx) -> CaseResult {
        let seed = seed()?;
        let replay = format!("seed {seed}; replay with {SEED_ENV}={seed}");
        let mut proxies = Vec::new();
        let mut clients: Vec<Arc<dyn LockBackend>> = Vec::new();
        for _ in 0..CLIENTS {
            match proxied(cx).await? {
                Ok((proxy, client)) => {
                    proxies.push(proxy);
                    clients.push(client);
                }
                Err(why) => skip!("{why}"),
            }
        }
        let names: Arc<Vec<_>> = Arc::new(
            (0..NAMES)
                .map(|i| cx.name(&format!("nemesis-{i}")))
                .collect(),
        );
        let resources: Arc<Vec<_>> =
            Arc::new((0..NAMES).map(|_| FencedResource::new(0_u64)).collect());
        let history = Arc::new(History::new());
        let ttl = fault_ttl(cx);
        let limit = ttl + cx.slack(ttl);
        let started = Instant::now();
        let workload = Workload {
            ttl,
            wait: ttl * 2,
            until: started + cx.scaled(Duration::from_secs(8)).max(ttl * 4),
            faults: Some(limit),
        };

        let mut tasks =
            spawn_random_clients(&clients, &names, &resources, &history, workload, seed);
        let (schedule, longest_fault) =
            nemesis(&proxies, StdRng::seed_from_u64(seed), ttl, workload.until).await;
        let healed = Instant::now();
        let schedule = schedule.join("\n");

        // Every call is bounded: the last operation started before `until`
        // (a waiting acquire: wait + limit), then one final release.
        let bound = workload.wait + limit * 2 + ttl / 10 + cx.scaled(Duration::from_secs(1));
        let give_up = workload.until + bound;
        while let Some(joined) = tokio::time::timeout_at(give_up, tasks.join_next())
            .await
            .map_err(|_| {
                Failure::new(format!(
                    "{} client task(s) still running {:?} after healing, past their calls' bounds \
                     ({replay}); fault schedule:\n{schedule}",
                    tasks.len(),
                    healed.elapsed()
                ))
            })?
        {
            joined
                .map_err(|e| Failure::new(format!("client task failed: {e} ({replay})")))?
                .map_err(|e| {
                    Failure::new(format!("{e} ({replay}); fault schedule:\n{schedule}"))
                })?;
        }
        let finished = Instant::now();

        let grants = history.grants();
        let run = workload.until - started;
        let least = min_grants(cx, ttl, run, longest_fault);
        // One line per run, for soak scripts (scripts/soak-nemesis.sh).
        eprintln!(
            "NEMESIS backend={} seed={seed} grants={} min={least} run={run:.1?} longest_fault={longest_fault:.2?}",
            cx.caps().backend,
            grants.len()
        );
        let violations = history.check();
        ensure!(
            violations.is_empty(),
            "history violations ({} grants, {replay}):\n{}\nfault schedule:\n{schedule}",
            grants.len(),
            violations.join("\n")
        );
        ensure!(
            grants.len() >= least,
            "the workload made too little progress: {} grants in {run:?} of faults, fewer than \
             {least} (per name, one per longest fault {longest_fault:?} + 2 × (TTL {ttl:?} + \
             declared slack {:?} + a round trip {:?})) ({replay}); fault schedule:\n{schedule}",
            grants.len(),
            cx.caps().slack_for(ttl),
            cx.round_trip(),
        );

        // Healed: each name is free again within TTL + slack, with a fence
        // above every fence handed out during the run.
        let fresh = cx.client().await?;
        let within = ttl + cx.slack(ttl) + cx.scaled(Duration::from_secs(3));
        for (n, name) in names.iter().enumerate() {
            let highest = grants
                .iter()
                .filter(|g| g.name == *name)
                .map(|g| g.fence)
                .max();
            let lease = cx
                .eventually(
                    (finished + within).saturating_duration_since(Instant::now()),
                    &format!("a healthy client's acquisition of {name} once healed"),
                    || async { Ok(fresh.try_acquire_for(name, ttl).await?.into_lease()) },
                )
                .await
                .map_err(|f| f.to_string());
            let lease = match lease {
                Ok(lease) => lease,
                Err(f) => {
                    // Who still holds it, and which grant of the run that is.
                    let holder = fresh.inspect(name).await;
                    let grant = holder.as_ref().ok().and_then(Option::as_ref).and_then(|h| {
                        grants
                            .iter()
                            .find(|g| g.name == *name && g.fence == h.fence)
                    });
                    return Err(Failure::new(format!(
                        "L1: {f} (tasks finished {:?} after healing; holder {holder:?}, granted in the \
                         run as {:?}; {replay}); fault schedule:\n{schedule}",
                        finished - healed,
                        grant.map(|g| (
                            g.client,
                            g.invoked - started,
                            g.granted - started,
                            g.ended.map(|e| e - started)
                        ))
                    )));
                }
            };
            ensure!(
                highest.is_none_or(|h| lease.fence() > h),
                "F1: {name}: fence {} after healing is not above the run's highest, {highest:?} \
                 (last write accepted: {:?}; {replay}); fault schedule:\n{schedule}",
                lease.fence(),
                resources[n].accepted().last()
            );
            fresh.release(&lease).await?;
        }
        drop(proxies);
        Ok(Outcome::Passed)
    }
}
