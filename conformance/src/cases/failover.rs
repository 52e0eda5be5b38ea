//! A nemesis for replicated stores: the random workload of the nemesis case
//! (try-acquire, waiting acquire, renew, fenced write, release, abandon)
//! runs on clients that reach the primary through an address that moves,
//! and beside it each client holds semaphore permits and an election's
//! leadership through `Locker` guards (renewed in the background, their
//! `lost()` heard), while the caller's `fail_over` kills the primary
//! (`kill -9`), promotes a replica and moves the address, again and again.
//! A permit counts as a lock per slot; a leadership as a lock of the
//! election's name, its term as the fence.
//!
//! What must hold depends on what the topology promises
//! ([`Failover`](lockcore::Failover), see [`Expect`]):
//! - **always**: per name, fences in real-time order (F1), across every
//!   failover; the fenced resources refuse every out-of-order write; two
//!   holders of a name overlap for at most a TTL (and a fifth for timers):
//!   a grant the failover lost was renewed last on the old primary, and its
//!   holder stops counting on it by its deadline, or when it hears sooner.
//! - **no overlap** (synchronous replication, or a lock delay): no two
//!   grants of one name counted on at once, and no fenced write refused
//!   while its writer still held a valid lease.
//!
//! A holder whose lease went with the old primary may hear so before its
//! local deadline (its renewal or release answered "not held"): that is
//! the failover, failing closed, and not counted against it. A store call
//! that times out or fails with a retryable error is an unknown outcome.
//!
//! The seed of each client's operations is printed with every failure and
//! in one `FAILOVER` line per run, for soak scripts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{FencedResource, HolderLabel, LockBackend, LockError, LockName, Locker};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::concurrency::{Workload, spawn_random_clients};
use crate::Failure;
use crate::history::{History, check_fence_order, check_no_overlap, check_overlap_at_most};

/// What a run checks, from what the topology promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Synchronous replication or a lock delay: no overlap at all.
    NoOverlap,
    /// Asynchronous replication without a lock delay: a grant lost in a
    /// failover may be granted again while its holder works, until its
    /// lease runs out: fence order is checked, and overlaps of at most a
    /// TTL allowed.
    FencesOnly,
}

/// One run of the failover nemesis.
#[derive(Debug, Clone)]
pub struct FailoverRun {
    /// The topology, as the `FAILOVER` line names it (e.g. `wait_replicas`).
    pub topology: &'static str,
    /// What the run checks.
    pub expect: Expect,
    /// The TTL every acquire asks for.
    pub ttl: Duration,
    /// The longest one store call may take across a failover (reconnects,
    /// retries): a call past it is an unknown outcome.
    pub call_limit: Duration,
    /// Failovers, one every `every`; the run goes on for two `every`s
    /// after the last (it must grant again after it).
    pub failovers: usize,
    /// Time between failovers (more than a lock delay, for progress).
    pub every: Duration,
    /// The clients' operations come from this.
    pub seed: u64,
}

/// Lock names the clients share.
const NAMES: usize = 2;

/// Runs `run` on `clients` (each reaching the current primary through the
/// moving address), calling `fail_over(round)` every `run.every`. Returns
/// the number of grants, or what broke.
pub async fn run_with_failovers<F, Fut>(
    clients: Vec<Arc<dyn LockBackend>>,
    run: FailoverRun,
    mut fail_over: F,
) -> Result<usize, Failure>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let seed = run.seed;
    let backend = clients
        .first()
        .map(|c| c.capabilities().backend)
        .unwrap_or_default();
    let salt: u64 = rand::random();
    let names: Arc<Vec<_>> = Arc::new(
        (0..NAMES)
            .map(|i| lockcore::LockName::new(format!("failover/{salt:x}/{i}")))
            .collect::<Result<_, _>>()
            .map_err(|e| Failure::new(format!("a lock name: {e}")))?,
    );
    let resources: Arc<Vec<_>> = Arc::new((0..NAMES).map(|_| FencedResource::new(0_u64)).collect());
    let history = Arc::new(History::new());
    let started = Instant::now();
    let rounds = u32::try_from(run.failovers).unwrap_or(u32::MAX);
    let workload = Workload {
        ttl: run.ttl,
        wait: run.ttl * 2,
        until: started + run.every * (rounds + 2),
        faults: Some(run.call_limit),
    };
    let mut tasks = spawn_random_clients(&clients, &names, &resources, &history, workload, seed);
    let held = Held {
        semaphore: LockName::new(format!("failover/{salt:x}/permits"))
            .map_err(|e| Failure::new(format!("a lock name: {e}")))?,
        election: LockName::new(format!("failover/{salt:x}/leader"))
            .map_err(|e| Failure::new(format!("a lock name: {e}")))?,
        ttl: run.ttl,
        limit: run.call_limit,
        until: workload.until,
    };
    for (i, backend) in clients.iter().enumerate() {
        let client = clients.len() + i;
        let (held, backend, history) = (held.clone(), backend.clone(), history.clone());
        let rng =
            StdRng::seed_from_u64(seed ^ (client as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
        tasks.spawn(async move { guarded_client(client, backend, &held, &history, rng).await });
    }
    let mut schedule = Vec::new();
    for round in 0..run.failovers {
        let at = started + run.every * (u32::try_from(round).unwrap_or(u32::MAX) + 1);
        tokio::time::sleep_until(at).await;
        fail_over(round).await;
        schedule.push(format!(
            "{:>8.2?} failover {round} ({:.2?})",
            at - started,
            at.elapsed()
        ));
    }
    let schedule = schedule.join("\n");
    let replay = format!("seed {seed:#x}");
    // Each client's last call started before `until` and is bounded.
    let give_up = workload.until + workload.wait + run.call_limit * 3;
    while let Some(joined) = tokio::time::timeout_at(give_up, tasks.join_next())
        .await
        .map_err(|_| {
            Failure::new(format!(
                "{} client task(s) still running past their calls' bounds ({replay}); \
                 failovers:\n{schedule}",
                tasks.len()
            ))
        })?
    {
        joined
            .map_err(|e| Failure::new(format!("client task failed: {e} ({replay})")))?
            .map_err(|e| Failure::new(format!("{e} ({replay}); failovers:\n{schedule}")))?;
    }
    let grants = history.grants();
    eprintln!(
        "FAILOVER backend={backend} topology={} expect={:?} seed={seed:#x} failovers={} grants={}",
        run.topology,
        run.expect,
        run.failovers,
        grants.len()
    );
    // A holder told "not held" before its deadline lost its lease with
    // the old primary (S2, S4): the failover failing closed.
    let mut violations: Vec<String> = history
        .violations()
        .into_iter()
        .filter(|v| !(v.starts_with("S2:") || v.starts_with("S4:")))
        .filter(|v| run.expect == Expect::NoOverlap || !v.starts_with("S1:"))
        .collect();
    violations.extend(check_fence_order(&grants));
    violations.extend(match run.expect {
        Expect::NoOverlap => check_no_overlap(&grants),
        Expect::FencesOnly => check_overlap_at_most(&grants, run.ttl + run.ttl / 5),
    });
    if !violations.is_empty() {
        return Err(Failure::new(format!(
            "history violations across failovers ({} grants, {replay}):\n{}\nfailovers:\n{schedule}",
            grants.len(),
            violations.join("\n")
        )));
    }
    // Progress: grants went on between failovers, not only before the first.
    let after_last = grants
        .iter()
        .filter(|g| g.invoked >= started + run.every * rounds)
        .count();
    if grants.len() < NAMES || (run.failovers > 0 && after_last == 0) {
        return Err(Failure::new(format!(
            "too little progress: {} grants, {after_last} after the last failover ({replay}); \
             failovers:\n{schedule}",
            grants.len()
        )));
    }
    Ok(grants.len())
}

/// What the guarded clients share.
#[derive(Debug, Clone)]
struct Held {
    /// A semaphore of [`PERMITS`].
    semaphore: LockName,
    election: LockName,
    ttl: std::time::Duration,
    limit: std::time::Duration,
    until: Instant,
}

/// Permits of the shared semaphore.
const PERMITS: u32 = 2;

/// One client holding through `Locker` guards until `held.until`: a permit
/// or the leadership, held 0–2 TTLs (renewed in the background), recorded
/// until its `lost()` fires or it lets go. A call past its bound or a
/// retryable error is an unknown outcome.
async fn guarded_client(
    client: usize,
    backend: Arc<dyn LockBackend>,
    held: &Held,
    history: &History,
    mut rng: StdRng,
) -> Result<(), Failure> {
    let fail = |op: &str, e: LockError| Failure::new(format!("client {client}: {op}: {e} ({e:?})"));
    let locker = Locker::new(backend).ttl(held.ttl);
    let semaphore = locker
        .semaphore(&held.semaphore, PERMITS)
        .map_err(|e| fail("semaphore", e))?;
    let election = locker
        .election(&held.election)
        .map_err(|e| fail("election", e))?;
    let label = HolderLabel::new(format!("client-{client}")).map_err(|e| fail("label", e))?;
    let bound = held.limit + held.ttl * 2;
    while Instant::now() < held.until {
        let invoked = Instant::now();
        let permit = rng.random_bool(0.5);
        let granted = if permit {
            let acquire = async {
                semaphore
                    .acquire_timeout(held.ttl * 2)
                    .await
                    .map(Holding::Permit)
            };
            tokio::time::timeout(bound, acquire).await
        } else {
            let campaign = async { election.campaign(label.clone()).await.map(Holding::Leader) };
            tokio::time::timeout(bound, campaign).await
        };
        let holding = match granted {
            Err(_elapsed) => continue,
            Ok(Err(e)) if e.is_retryable() || matches!(e, LockError::Timeout { .. }) => continue,
            Ok(Err(e)) => return Err(fail(if permit { "permit" } else { "campaign" }, e)),
            Ok(Ok(holding)) => holding,
        };
        let guard = holding.guard();
        let name = match guard.slot() {
            Some(slot) => LockName::new(format!("{}#{slot}", held.semaphore))
                .map_err(|e| fail("slot name", e))?,
            None => held.election.clone(),
        };
        let at = history.granted(client, &name, guard.fencing_token(), invoked);
        let hold = held.ttl.mul_f64(rng.random_range(0.0..2.0));
        tokio::select! {
            _ = guard.lost() => history.end(at, Instant::now()),
            _ = tokio::time::sleep(hold) => {
                history.end(at, Instant::now());
                let _ = tokio::time::timeout(held.limit, holding.release()).await;
            }
        }
    }
    Ok(())
}

/// A permit or a leadership, held through its guard.
enum Holding {
    Permit(lockcore::LockGuard),
    Leader(lockcore::Leadership),
}

impl Holding {
    fn guard(&self) -> &lockcore::LockGuard {
        match self {
            Holding::Permit(guard) => guard,
            Holding::Leader(leadership) => leadership.guard(),
        }
    }

    async fn release(self) -> Result<lockcore::ReleaseOutcome, LockError> {
        match self {
            Holding::Permit(guard) => guard.release().await,
            Holding::Leader(leadership) => leadership.resign().await,
        }
    }
}
