//! Backend-independent measurements: timed operations taking turns in
//! slices, lock clients (the trait, `Locker`, a peer) and N-way contention
//! with hand-off times and fairness. Every backend module feeds these the
//! same way.

use std::any::Any;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{LockRequest, async_trait};
use lockcore::{
    Access, Election, HolderLabel, Lease, LockBackend, LockError, LockGuard, LockName, Locker,
    MultiGuard, RwLock, Semaphore,
};
use tokio::time::Instant;

use crate::Settings;

/// Completed operations and their latencies over a run.
#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    pub elapsed: Duration,
    pub samples: Vec<Duration>,
}

impl Stats {
    pub(crate) fn per_sec(&self) -> f64 {
        self.samples.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(crate) fn percentile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted = self.samples.clone();
        sorted.sort();
        let at = ((sorted.len() - 1) as f64 * q).round() as usize;
        Some(sorted[at])
    }

    pub(crate) fn p50(&self) -> Option<Duration> {
        self.percentile(0.50)
    }

    pub(crate) fn merge(&mut self, part: Stats) {
        self.elapsed += part.elapsed;
        self.samples.extend(part.samples);
    }
}

/// One measured operation (a floor's round trips, a lock cycle...).
pub(crate) type Op = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// An [`Op`] from a closure that makes the operation's future.
pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Box::new(move || f().boxed())
}

/// Runs `op` back to back for `run` (after `warmup`), timing each call.
pub(crate) async fn timed(op: &Op, warmup: Duration, run: Duration) -> Stats {
    let warm_until = Instant::now() + warmup;
    while Instant::now() < warm_until {
        op().await;
    }
    let started = Instant::now();
    let mut samples = Vec::new();
    // At least one sample: a smoke run must show every row ran.
    while samples.is_empty() || started.elapsed() < run {
        let t = Instant::now();
        op().await;
        samples.push(t.elapsed());
    }
    Stats {
        elapsed: started.elapsed(),
        samples,
    }
}

/// Every op for `settings.run` in total, taking turns in slices (the order
/// flipped every round), so load from other processes drifting during the
/// run hits all of them alike: their ratios are what the table compares.
pub(crate) async fn interleaved(ops: &[Op], settings: &Settings) -> Vec<Stats> {
    let slices = settings.slices.max(1);
    let slice = settings.run / slices;
    let warmup = settings.warmup / ops.len().max(1) as u32;
    for op in ops {
        timed(op, Duration::ZERO, warmup).await;
    }
    let mut totals = vec![Stats::default(); ops.len()];
    for round in 0..slices {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..ops.len()).collect()
        } else {
            (0..ops.len()).rev().collect()
        };
        for i in order {
            totals[i].merge(timed(&ops[i], Duration::ZERO, slice).await);
        }
    }
    totals
}

/// Whatever a client holds between acquire and release.
pub(crate) type Held = Box<dyn Any + Send>;

/// One lock client: the trait, a `Locker`, or a peer library.
#[async_trait]
pub(crate) trait Client: Send + Sync {
    /// Takes the lock, waiting until `deadline` at most (`None`: not by then).
    async fn acquire(&self, deadline: Instant) -> Option<Held>;
    async fn release(&self, held: Held);
}

/// A shared client.
pub(crate) type Shared = Arc<dyn Client>;

/// How a client asks: one attempt (the lock must be free), or waiting.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ask {
    Try,
    Wait,
}

/// `LockBackend` called directly: no guard, no renewer, no tracing span.
pub(crate) struct Raw {
    backend: Arc<dyn LockBackend>,
    request: LockRequest,
    ask: Ask,
}

impl Raw {
    pub(crate) fn shared(
        backend: Arc<dyn LockBackend>,
        name: &str,
        ttl: Duration,
        ask: Ask,
    ) -> Shared {
        let ttl = backend
            .capabilities()
            .effective_ttl(ttl)
            .expect("the bench TTL is valid for every backend");
        let request = LockRequest::new(LockName::new(name).expect("a valid name"), ttl);
        Arc::new(Raw {
            backend,
            request,
            ask,
        })
    }
}

#[async_trait]
impl Client for Raw {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let lease = match self.ask {
            Ask::Try => Some(
                self.backend
                    .try_acquire(&self.request)
                    .await
                    .expect("try_acquire")
                    .into_lease()
                    .expect("an uncontended lock must be free"),
            ),
            Ask::Wait => self
                .backend
                .acquire(&self.request, &WaitPolicy::new(deadline))
                .await
                .expect("acquire"),
        };
        lease.map(|l| Box::new(l) as Held)
    }

    async fn release(&self, held: Held) {
        let lease = held.downcast::<Lease>().expect("a lease");
        self.backend.release(&lease).await.expect("release");
    }
}

/// What applications call: `Locker::acquire` / `try_acquire`, then
/// `LockGuard::release` (the renewer keeps each guard meanwhile).
pub(crate) struct User {
    locker: Locker,
    name: LockName,
    ask: Ask,
}

impl User {
    pub(crate) fn shared(locker: Locker, name: &str, ask: Ask) -> Shared {
        let name = LockName::new(name).expect("a valid name");
        Arc::new(User { locker, name, ask })
    }
}

/// The `Locker` every row and scenario uses: defaults, but the bench's TTL.
pub(crate) fn locker(backend: Arc<dyn LockBackend>, ttl: Duration) -> Locker {
    Locker::from_arc(backend).ttl(ttl)
}

#[async_trait]
impl Client for User {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let guard = match self.ask {
            Ask::Try => Some(
                self.locker
                    .try_acquire(&self.name)
                    .await
                    .expect("Locker::try_acquire")
                    .expect("an uncontended lock must be free"),
            ),
            Ask::Wait => {
                let wait = deadline.saturating_duration_since(Instant::now());
                match self.locker.acquire_timeout(&self.name, wait).await {
                    Ok(guard) => Some(guard),
                    Err(LockError::Timeout { .. }) => None,
                    Err(e) => panic!("Locker::acquire: {e}"),
                }
            }
        };
        guard.map(|g| Box::new(g) as Held)
    }

    async fn release(&self, held: Held) {
        let guard = held.downcast::<LockGuard>().expect("a guard");
        guard.release().await.expect("LockGuard::release");
    }
}

/// A semaphore through `Locker::semaphore`: `Semaphore::acquire` /
/// `try_acquire`, then `LockGuard::release`, like the lock rows.
pub(crate) struct Permits {
    semaphore: Semaphore,
    ask: Ask,
}

impl Permits {
    pub(crate) fn shared(locker: Locker, name: &str, permits: u32, ask: Ask) -> Shared {
        let semaphore = locker.semaphore(name, permits).expect("a valid semaphore");
        Arc::new(Permits { semaphore, ask })
    }
}

#[async_trait]
impl Client for Permits {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let guard = match self.ask {
            Ask::Try => Some(
                self.semaphore
                    .try_acquire()
                    .await
                    .expect("Semaphore::try_acquire")
                    .expect("an uncontended permit must be free"),
            ),
            Ask::Wait => {
                let wait = deadline.saturating_duration_since(Instant::now());
                match self.semaphore.acquire_timeout(wait).await {
                    Ok(guard) => Some(guard),
                    Err(LockError::Timeout { .. }) => None,
                    Err(e) => panic!("Semaphore::acquire: {e}"),
                }
            }
        };
        guard.map(|g| Box::new(g) as Held)
    }

    async fn release(&self, held: Held) {
        let guard = held.downcast::<LockGuard>().expect("a guard");
        guard.release().await.expect("LockGuard::release");
    }
}

/// A reader-writer lock through `Locker::rw_lock`: `read_timeout` or
/// `write_timeout`, then `LockGuard::release`, like the lock rows.
pub(crate) struct Rw {
    lock: RwLock,
    access: Access,
}

impl Rw {
    pub(crate) fn shared(locker: Locker, name: &str, access: Access) -> Shared {
        let lock = locker.rw_lock(name).expect("a valid reader-writer lock");
        Arc::new(Rw { lock, access })
    }
}

#[async_trait]
impl Client for Rw {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let taken = match self.access {
            Access::Read => self.lock.read_timeout(wait).await,
            Access::Write => self.lock.write_timeout(wait).await,
        };
        match taken {
            Ok(guard) => Some(Box::new(guard) as Held),
            Err(LockError::Timeout { .. }) => None,
            Err(e) => panic!("RwLock {}: {e}", self.access),
        }
    }

    async fn release(&self, held: Held) {
        let guard = held.downcast::<LockGuard>().expect("a guard");
        guard.release().await.expect("LockGuard::release");
    }
}

/// Several names at once through `Locker::acquire_all` / `try_acquire_all`,
/// then `MultiGuard::release`, like the lock rows.
pub(crate) struct Multi {
    locker: Locker,
    names: Vec<LockName>,
    ask: Ask,
}

impl Multi {
    pub(crate) fn shared(locker: Locker, names: &[String], ask: Ask) -> Shared {
        let names = names
            .iter()
            .map(|n| LockName::new(n).expect("a valid name"))
            .collect();
        Arc::new(Multi { locker, names, ask })
    }
}

#[async_trait]
impl Client for Multi {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let guard = match self.ask {
            Ask::Try => Some(
                self.locker
                    .try_acquire_all(&self.names)
                    .await
                    .expect("Locker::try_acquire_all")
                    .expect("uncontended locks must be free"),
            ),
            Ask::Wait => {
                let wait = deadline.saturating_duration_since(Instant::now());
                match self.locker.acquire_all_timeout(&self.names, wait).await {
                    Ok(guard) => Some(guard),
                    Err(LockError::Timeout { .. }) => None,
                    Err(e) => panic!("Locker::acquire_all: {e}"),
                }
            }
        };
        guard.map(|g| Box::new(g) as Held)
    }

    async fn release(&self, held: Held) {
        let guard = held.downcast::<MultiGuard>().expect("a multi-guard");
        guard.release().await.expect("MultiGuard::release");
    }
}

/// Leader hand-overs between two candidates (each its own `Locker` on its
/// own backend instance, like two processes) for `run`, at least one: the
/// other candidate campaigns, waits `settle` (long enough to be in line),
/// and the leader resigns. Each sample is from the start of `resign()` to
/// the waiting candidate's `campaign` returning; the new leader is the next
/// round's leader.
pub(crate) async fn leader_handovers(
    candidates: [Election; 2],
    settle: Duration,
    run: Duration,
) -> Stats {
    let labels =
        ["bench-leader-0", "bench-leader-1"].map(|l| HolderLabel::new(l).expect("a valid label"));
    let mut leader = candidates[0]
        .campaign(labels[0].clone())
        .await
        .expect("Election::campaign");
    let mut current = 0;
    let started = Instant::now();
    let mut samples = Vec::new();
    while samples.is_empty() || started.elapsed() < run {
        let next = 1 - current;
        let (election, label) = (candidates[next].clone(), labels[next].clone());
        let waiting = tokio::spawn(async move {
            let leadership = election.campaign(label).await;
            (leadership, Instant::now())
        });
        tokio::time::sleep(settle).await;
        let resigned = Instant::now();
        leader.resign().await.expect("Leadership::resign");
        let (leadership, led) = waiting.await.expect("the campaign task");
        samples.push(led - resigned);
        leader = leadership.expect("Election::campaign");
        current = next;
    }
    let elapsed = started.elapsed();
    leader.resign().await.expect("Leadership::resign");
    Stats { elapsed, samples }
}

/// One uncontended cycle of `client`: acquire (it must be free) and release.
pub(crate) fn cycle(client: Shared) -> Op {
    op(move || {
        let client = client.clone();
        async move {
            let far = Instant::now() + Duration::from_secs(60);
            let held = client
                .acquire(far)
                .await
                .expect("an uncontended lock must be granted");
            client.release(held).await;
        }
    })
}

/// What a contended run measured.
#[derive(Debug, Default, Clone)]
pub(crate) struct Contended {
    /// Hand-off times: from the previous holder starting its release to
    /// the next holder having the grant.
    pub handoffs: Stats,
    /// Grants during the run, per client.
    pub per_client: Vec<usize>,
    /// Grants that went straight back to the client that had just released.
    pub regrants: usize,
}

impl Contended {
    pub(crate) fn grants(&self) -> usize {
        self.per_client.iter().sum()
    }

    pub(crate) fn per_sec(&self) -> f64 {
        self.grants() as f64 / self.handoffs.elapsed.as_secs_f64().max(1e-9)
    }

    /// Share of grants that went straight back to the client that had just
    /// released: 0 in a strict FIFO line of N > 1, 1/N at random.
    pub(crate) fn regrant_share(&self) -> f64 {
        self.regrants as f64 / self.grants().max(1) as f64
    }

    fn merge(&mut self, part: Contended) {
        self.handoffs.merge(part.handoffs);
        self.per_client
            .resize(self.per_client.len().max(part.per_client.len()), 0);
        for (total, n) in self.per_client.iter_mut().zip(part.per_client) {
            *total += n;
        }
        self.regrants += part.regrants;
    }

    /// "re-grants 3%, per client 40..61".
    pub(crate) fn fairness(&self) -> String {
        let min = self.per_client.iter().min().copied().unwrap_or(0);
        let max = self.per_client.iter().max().copied().unwrap_or(0);
        format!(
            "re-grants to the releaser {:.0}%, per client {min}..{max}",
            self.regrant_share() * 100.0
        )
    }
}

/// How long waiters may still take to drain after a contended run ends.
const DRAIN: Duration = Duration::from_secs(10);

/// `clients` loop acquire (waiting) / release on one name for `run`.
pub(crate) async fn contended(clients: &[Shared], run: Duration) -> Contended {
    struct Line {
        released_at: Option<Instant>,
        last: Option<usize>,
        result: Contended,
    }
    let line = Arc::new(Mutex::new(Line {
        released_at: None,
        last: None,
        result: Contended {
            per_client: vec![0; clients.len()],
            ..Contended::default()
        },
    }));
    let started = Instant::now();
    let stop_at = started + run;
    let mut tasks = Vec::new();
    for (i, client) in clients.iter().cloned().enumerate() {
        let line = line.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                let Some(held) = client.acquire(stop_at + DRAIN).await else {
                    break;
                };
                let granted = Instant::now();
                {
                    let mut line = line.lock().unwrap();
                    if granted < stop_at {
                        if let Some(released) = line.released_at {
                            line.result.handoffs.samples.push(granted - released);
                        }
                        if line.last == Some(i) {
                            line.result.regrants += 1;
                        }
                        line.result.per_client[i] += 1;
                    }
                    line.last = Some(i);
                    line.released_at = Some(Instant::now());
                }
                client.release(held).await;
            }
        }));
    }
    for task in tasks {
        if let Err(e) = task.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let mut result = std::mem::take(&mut line.lock().unwrap().result);
    result.handoffs.elapsed = run;
    result
}

/// Each kind's clients contend in turn, in slices, for `settings.run` in
/// total each, after a warm-up: the kinds see the same machine load.
pub(crate) async fn contended_interleaved(
    kinds: &[Vec<Shared>],
    settings: &Settings,
) -> Vec<Contended> {
    let slices = settings.slices.max(1);
    let warmup = settings.warmup / kinds.len().max(1) as u32;
    if !warmup.is_zero() {
        for kind in kinds {
            contended(kind, warmup).await;
        }
    }
    let mut totals = vec![Contended::default(); kinds.len()];
    for round in 0..slices {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..kinds.len()).collect()
        } else {
            (0..kinds.len()).rev().collect()
        };
        for i in order {
            totals[i].merge(contended(&kinds[i], settings.run / slices).await);
        }
    }
    totals
}

/// Milliseconds, for ratios.
pub(crate) fn ms(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}
