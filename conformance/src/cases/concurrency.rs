//! T2: many clients at once, checked by history.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{FencedResource, Lease, LockBackend, LockError, ReleaseOutcome};
use rand::Rng;
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
    let until = Instant::now() + cx.scaled(Duration::from_secs(3)).max(ttl * 4);
    let seed: u64 = rand::random();
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let backend = cx.client().await?;
        let (names, resources, history) = (names.clone(), resources.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            random_client(client, backend, &names, &resources, &history, ttl, until).await
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(format!("client task failed: {e}")))??;
    }
    let grants = history.grants().len();
    ensure!(
        grants >= CLIENTS,
        "only {grants} grants in the whole run (seed {seed:x})"
    );
    let violations = history.check();
    ensure!(
        violations.is_empty(),
        "history violations ({grants} grants):\n{}",
        violations.join("\n")
    );
    Ok(Outcome::Passed)
}

async fn random_client(
    client: usize,
    backend: Arc<dyn LockBackend>,
    names: &[lockcore::LockName],
    resources: &[FencedResource<u64>],
    history: &History,
    ttl: Duration,
    until: Instant,
) -> Result<(), LockError> {
    // (name index, lease, history index)
    let mut held: Option<(usize, Lease, usize)> = None;
    while Instant::now() < until {
        let roll = rand::rng().random_range(0..100);
        match held.take() {
            None => {
                let n = rand::rng().random_range(0..names.len());
                let invoked = Instant::now();
                let lease = if roll < 50 {
                    backend.try_acquire(&names[n], ttl).await?.into_lease()
                } else {
                    let wait = lockcore::WaitPolicy::new(invoked + ttl * 2);
                    backend.acquire(&names[n], ttl, &wait).await?
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
                    match backend.renew(&lease).await {
                        Ok(renewed) => {
                            history.counts_until(at, renewed.deadline());
                            held = Some((n, renewed, at));
                        }
                        Err(LockError::NotHeld { .. }) => {
                            let answered = Instant::now();
                            if answered < lease.deadline() {
                                history.violation(format!(
                                    "S4: client {client}: renew sent {:?} before the deadline was refused",
                                    lease.deadline() - sent
                                ));
                            }
                        }
                        Err(e) => return Err(e),
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
                    if backend.release(&lease).await? == ReleaseOutcome::NotHeld
                        && Instant::now() < lease.deadline()
                    {
                        history.violation(format!(
                            "S2: client {client}: release before the deadline found the lock not held"
                        ));
                    }
                } else {
                    // Abandon: stop renewing, let it expire; it ended at its deadline.
                }
            }
        }
        let pause = Duration::from_millis(
            rand::rng().random_range(0..=(ttl.as_millis() as u64 / 10).max(1)),
        );
        tokio::time::sleep(pause).await;
    }
    if let Some((_, lease, at)) = held {
        history.end(at, Instant::now());
        let _ = backend.release(&lease).await?;
    }
    Ok(())
}
