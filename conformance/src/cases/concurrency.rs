//! T2: many clients at once, checked by history.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{FencedResource, Lease, LockBackend, LockError, ReleaseOutcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::history::History;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure};

/// Sixteen clients on two names each do read, sleep, write+1 through a
/// fenced counter (ShedLock's FuzzTester, Jepsen's lock-set): the counters
/// must be exact, no write refused, fences in order, no two holders at once.
pub async fn fenced_counter_is_exact(cx: &Ctx) -> CaseResult {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 8;
    let names = [cx.name("counter-0"), cx.name("counter-1")];
    let counters = [
        Arc::new(FencedResource::new(0_u64)),
        Arc::new(FencedResource::new(0_u64)),
    ];
    let history = Arc::new(History::new());
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let locker = cx.locker(&cx.client().await?, cx.long_ttl());
        let slot = client % names.len();
        let (name, counter, history) =
            (names[slot].clone(), counters[slot].clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let invoked = Instant::now();
                let guard = locker.acquire(&name).await?;
                let grant = history.granted(client, &name, guard.fencing_token(), invoked);
                let seen = counter.read();
                let pause = Duration::from_millis(rand::rng().random_range(1..=5));
                tokio::time::sleep(pause).await;
                if !guard.is_held() {
                    history.violation(format!(
                        "client {client} lost its lease on {name} mid-round"
                    ));
                }
                if let Err(stale) = counter.write(guard.fencing_token(), |v| *v = seen + 1) {
                    history.violation(format!(
                        "client {client}: a write under a held lease was refused: {stale}"
                    ));
                }
                history.end(grant, Instant::now());
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(format!("client task failed: {e}")))??;
    }
    let per_name = (CLIENTS / names.len() * ROUNDS) as u64;
    for (name, counter) in names.iter().zip(&counters) {
        ensure!(
            counter.read() == per_name,
            "lost update on {name}: counter {} after {per_name} increments",
            counter.read()
        );
        ensure!(
            counter.rejected() == 0,
            "{} fenced writes on {name} were refused",
            counter.rejected()
        );
    }
    let violations = history.check();
    ensure!(
        violations.is_empty(),
        "history violations:\n{}",
        violations.join("\n")
    );
    Ok(Outcome::Passed)
}

/// Eight clients run a random mix of try-acquire, waiting acquire, renew,
/// fenced write, release and abandonment over three names with a short TTL.
/// The recorded history must show fences in real-time order, no two holders
/// at once, no write refused while its writer validly held the lock, and no
/// renewal refused before the lease's deadline.
pub async fn random_workload_history_is_clean(cx: &Ctx) -> CaseResult {
    const CLIENTS: usize = 8;
    let names: Arc<Vec<_>> = Arc::new((0..3).map(|i| cx.name(&format!("random-{i}"))).collect());
    let resources: Arc<Vec<_>> = Arc::new((0..3).map(|_| FencedResource::new(0_u64)).collect());
    let history = Arc::new(History::new());
    let ttl = cx.short_ttl();
    let workload = Workload {
        ttl,
        wait: ttl * 2,
        until: Instant::now() + cx.scaled(Duration::from_secs(3)).max(ttl * 4),
        faults: None,
    };
    let seed: u64 = rand::random();
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let backend = cx.client().await?;
        let (names, resources, history) = (names.clone(), resources.clone(), history.clone());
        let rng = client_rng(seed, client);
        tasks.push(tokio::spawn(async move {
            random_client(client, backend, &names, &resources, &history, workload, rng).await
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(format!("client task failed: {e}")))?
            .map_err(|e| Failure::new(format!("{e} (seed {seed:x})")))?;
    }
    let grants = history.grants().len();
    ensure!(
        grants >= CLIENTS,
        "only {grants} grants in the whole run (seed {seed:x})"
    );
    let violations = history.check();
    ensure!(
        violations.is_empty(),
        "history violations ({grants} grants, seed {seed:x}):\n{}",
        violations.join("\n")
    );
    Ok(Outcome::Passed)
}

/// How [`random_client`] runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Workload {
    /// The TTL every acquire asks for.
    pub(crate) ttl: Duration,
    /// How long a waiting acquire waits (never past `until`).
    pub(crate) wait: Duration,
    /// No new operation starts after this.
    pub(crate) until: Instant,
    /// `Some(limit)`: the network is faulty. Every store call is bounded by
    /// `limit` (a waiting acquire by its wait + `limit`), and a timed-out
    /// call or a retryable error is an unknown outcome: nothing is recorded
    /// as granted, a lease whose renewal got no answer keeps its old
    /// deadline. `None`: a healthy network, where every error fails.
    pub(crate) faults: Option<Duration>,
}

/// Starts one [`random_client`] per backend of `clients` (client `i` on
/// `clients[i]`, its operations from `seed`), under `workload`.
pub(crate) fn spawn_random_clients(
    clients: &[Arc<dyn LockBackend>],
    names: &Arc<Vec<lockcore::LockName>>,
    resources: &Arc<Vec<FencedResource<u64>>>,
    history: &Arc<History>,
    workload: Workload,
    seed: u64,
) -> tokio::task::JoinSet<Result<(), Failure>> {
    let mut tasks = tokio::task::JoinSet::new();
    for (client, backend) in clients.iter().enumerate() {
        let (backend, names, resources, history) = (
            backend.clone(),
            names.clone(),
            resources.clone(),
            history.clone(),
        );
        let rng = client_rng(seed, client);
        tasks.spawn(async move {
            random_client(client, backend, &names, &resources, &history, workload, rng).await
        });
    }
    tasks
}

/// Client `client`'s RNG for a run seeded with `seed`: a replayed seed
/// replays each client's choice of operations (not their timing).
pub(crate) fn client_rng(seed: u64, client: usize) -> StdRng {
    StdRng::seed_from_u64(seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Runs `call` as `workload` says: `Ok(None)` is an unknown outcome (a
/// timeout, or a retryable error under faults).
async fn bounded<T>(
    faults: Option<Duration>,
    extra: Duration,
    call: impl Future<Output = Result<T, LockError>>,
) -> Result<Option<T>, LockError> {
    let Some(limit) = faults else {
        return call.await.map(Some);
    };
    match tokio::time::timeout(limit + extra, call).await {
        Err(_elapsed) => Ok(None),
        Ok(Err(e)) if e.is_retryable() => Ok(None),
        Ok(answer) => answer.map(Some),
    }
}

/// One client of the random workload: a random mix of try-acquire, waiting
/// acquire, renew, fenced write, release and abandonment over `names`,
/// recording every grant in `history` and every rule broken on the way as a
/// violation there. Returns an error the workload does not expect (under
/// faults: anything but a retryable error, a timeout, `NotHeld` or `Lost`).
pub(crate) async fn random_client(
    client: usize,
    backend: Arc<dyn LockBackend>,
    names: &[lockcore::LockName],
    resources: &[FencedResource<u64>],
    history: &History,
    workload: Workload,
    mut rng: StdRng,
) -> Result<(), Failure> {
    let Workload {
        ttl,
        wait,
        until,
        faults,
    } = workload;
    let fail = |op: &str, e: LockError| Failure::new(format!("client {client}: {op}: {e} ({e:?})"));
    // (name index, lease, history index)
    let mut held: Option<(usize, Lease, usize)> = None;
    while Instant::now() < until {
        let roll = rng.random_range(0..100);
        match held.take() {
            None => {
                let n = rng.random_range(0..names.len());
                let invoked = Instant::now();
                let lease = if roll < 50 {
                    bounded(
                        faults,
                        Duration::ZERO,
                        backend.try_acquire_for(&names[n], ttl),
                    )
                    .await
                    .map_err(|e| fail("try_acquire", e))?
                    .and_then(|attempt| attempt.into_lease())
                } else {
                    // Never waits past `until`, so the run ends on time.
                    let deadline = (invoked + wait).min(until.max(invoked + ttl / 10));
                    let policy = lockcore::backend::wait::WaitPolicy::new(deadline);
                    bounded(faults, wait, backend.acquire_for(&names[n], ttl, &policy))
                        .await
                        .map_err(|e| fail("acquire", e))?
                        .flatten()
                };
                if let Some(lease) = lease {
                    let at = history.granted(client, &names[n], lease.fence(), invoked);
                    history.counts_until(at, lease.deadline());
                    held = Some((n, lease, at));
                }
            }
            Some((n, lease, at)) => {
                if lease.is_expired() {
                    continue; // already ended at its deadline
                }
                if roll < 40 {
                    let sent = Instant::now();
                    match bounded(faults, Duration::ZERO, backend.renew(&lease)).await {
                        Ok(Some(renewed)) => {
                            history.counts_until(at, renewed.deadline());
                            held = Some((n, renewed, at));
                        }
                        // No answer: the store may or may not have renewed;
                        // the client still counts on the old deadline.
                        Ok(None) => held = Some((n, lease, at)),
                        Err(LockError::NotHeld { .. }) => {
                            let answered = Instant::now();
                            if answered < lease.deadline() {
                                history.violation(format!(
                                    "S4: client {client}: renew sent {:?} before the deadline was refused",
                                    lease.deadline() - sent
                                ));
                            }
                        }
                        Err(LockError::Lost { .. }) if faults.is_some() => {
                            let answered = Instant::now();
                            if answered < lease.deadline() {
                                history.violation(format!(
                                    "S4: client {client}: renew sent {:?} before the deadline reported the lease lost",
                                    lease.deadline() - sent
                                ));
                            }
                        }
                        Err(e) => return Err(fail("renew", e)),
                    }
                } else if roll < 75 {
                    let token = lease.fence();
                    let refused = resources[n].write(token, |v| *v += 1).err();
                    let now = Instant::now();
                    if let Some(stale) = refused
                        && now < lease.deadline()
                    {
                        history.violation(format!(
                            "S1: client {client}: write under a valid lease refused: {stale}"
                        ));
                    }
                    held = Some((n, lease, at));
                } else if roll < 92 {
                    history.end(at, Instant::now());
                    match bounded(faults, Duration::ZERO, backend.release(&lease)).await {
                        Ok(Some(ReleaseOutcome::NotHeld)) if Instant::now() < lease.deadline() => {
                            history.violation(format!(
                                "S2: client {client}: release before the deadline found the lock not held"
                            ));
                        }
                        Ok(_) => {}
                        Err(LockError::NotHeld { .. } | LockError::Lost { .. })
                            if faults.is_some() => {}
                        Err(e) => return Err(fail("release", e)),
                    }
                } else {
                    // Abandon: stop renewing, let it expire; it ended at its deadline.
                }
            }
        }
        let pause =
            Duration::from_millis(rng.random_range(0..=(ttl.as_millis() as u64 / 10).max(1)));
        tokio::time::sleep(pause).await;
    }
    // The client stops, and its connection with it (the caller drops the
    // backend): from here on it counts on nothing, not even a grant it
    // abandoned earlier.
    history.client_stopped(client, Instant::now());
    if let Some((_, lease, _)) = held {
        match bounded(faults, Duration::ZERO, backend.release(&lease)).await {
            Ok(_) => {}
            Err(LockError::NotHeld { .. } | LockError::Lost { .. }) if faults.is_some() => {}
            Err(e) => return Err(fail("final release", e)),
        }
    }
    Ok(())
}
