//! The two scale scenarios, through one `Locker` as an application would
//! use it: many held locks kept alive by the renewer, and many waiters on
//! one name. The store is asked what it served (its own counters) and how
//! many connections it has; the kernel, what each side spent in CPU.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use lockcore::backend::{LockRequest, WaitPolicy, Wakeup, async_trait};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockGuard,
    LockName, ReleaseOutcome,
};
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Ask, Raw, User};
use crate::report::{Report, ScaleRow, Verdict, bytes};
use crate::sys;

/// What the store can tell about itself.
#[async_trait]
pub(crate) trait Probe: Send + Sync {
    /// What [`requests`](Self::requests) counts, e.g. "commands (INFO commandstats)".
    fn unit(&self) -> &'static str {
        "n/a"
    }
    /// Requests the server has served so far, by its own count.
    async fn requests(&self) -> Option<u64> {
        None
    }
    /// Client connections the server has open now.
    async fn connections(&self) -> Option<u64> {
        None
    }
    /// The server process (its CPU is measured), if it runs on this host.
    fn pid(&self) -> Option<u32> {
        None
    }
}

/// No server: the store lives in this process.
pub(crate) struct InProcess;

impl Probe for InProcess {}

/// The connections one backend instance is configured to use.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub size: u64,
    pub what: String,
}

/// How a scenario connects its own backend instance (after the probe has
/// counted the server's connections without it).
pub(crate) type Connect = BoxFuture<'static, Arc<dyn LockBackend>>;

/// Both scenarios for one backend.
pub(crate) async fn run(
    backend: &str,
    connect: impl Fn() -> Connect,
    probe: &dyn Probe,
    pool: Pool,
    settings: &Settings,
) -> Report {
    let mut report = Report::default();
    requests_per_cycle(backend, connect(), probe, settings, &mut report).await;
    held_locks(backend, connect(), probe, &pool, settings, &mut report).await;
    waiters(backend, connect(), probe, &pool, settings, &mut report).await;
    report
}

/// The server's CPU time so far, if it runs here.
fn store_cpu(probe: &dyn Probe) -> Option<Duration> {
    probe.pid().and_then(sys::tree_cpu)
}

fn store_share(before: Option<Duration>, probe: &dyn Probe, window: Duration) -> String {
    match (before, store_cpu(probe)) {
        (Some(a), Some(b)) => sys::share(b.saturating_sub(a), window),
        _ if probe.pid().is_none() => "n/a (in this process or not local)".into(),
        _ => "n/a".into(),
    }
}

/// The server's connections once those of clients dropped just before
/// are gone (closing is asynchronous): the count once it has not changed
/// for `stable` (a second; less in a smoke run), or the latest after 10 s.
async fn settled_connections(probe: &dyn Probe, settings: &Settings) -> Option<u64> {
    let stable = if settings.smoke {
        Duration::from_millis(400)
    } else {
        Duration::from_secs(1)
    };
    let mut last = probe.connections().await?;
    let mut stable_since = Instant::now();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = probe.connections().await?;
        if now != last {
            (last, stable_since) = (now, Instant::now());
        } else if stable_since.elapsed() >= stable || Instant::now() >= until {
            return Some(now);
        }
    }
}

/// The probe's own requests per reading (its reads may count themselves).
async fn own_requests(probe: &dyn Probe) -> u64 {
    match (probe.requests().await, probe.requests().await) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    }
}

/// What one uncontended acquire + release costs the store, by its own
/// count: through the trait, and through `Locker` (try and waiting).
async fn requests_per_cycle(
    backend_name: &str,
    connect: Connect,
    probe: &dyn Probe,
    settings: &Settings,
    report: &mut Report,
) {
    if probe.requests().await.is_none() {
        return;
    }
    let backend = connect.await;
    let own = own_requests(probe).await;
    let n: u32 = if settings.smoke { 5 } else { 200 };
    let (name, ttl) = ("bench/cycle", settings.ttl);
    let kinds = [
        (
            "trait try_acquire",
            Raw::shared(backend.clone(), name, ttl, Ask::Try),
        ),
        (
            "Locker try_acquire",
            User::shared(harness::locker(backend.clone(), ttl), name, Ask::Try),
        ),
        (
            "Locker acquire",
            User::shared(harness::locker(backend, ttl), name, Ask::Wait),
        ),
    ];
    let mut counts = Vec::new();
    for (label, client) in kinds {
        let cycle = harness::cycle(client);
        cycle().await; // a first use may set things up (a subscription)
        let before = probe.requests().await;
        for _ in 0..n {
            cycle().await;
        }
        if let (Some(a), Some(b)) = (before, probe.requests().await) {
            let per = b.saturating_sub(a).saturating_sub(own) as f64 / f64::from(n);
            counts.push(format!("{label} {per:.1}"));
        }
    }
    report.scale.push(ScaleRow {
        backend: backend_name.to_string(),
        scenario: format!("store requests per uncontended acquire + release ({n} cycles)"),
        ran: !counts.is_empty(),
        result: counts.join("; "),
        round_trips: probe.unit().to_string(),
        connections: "-".into(),
        client_cpu: "-".into(),
        store_cpu: "-".into(),
        rss: "-".into(),
    });
}

/// Scenario (a): `settings.held` locks held through one `Locker` with
/// auto-renew at a short TTL; over a window after they settle, the store's
/// requests per renew tick, client and store CPU, client RSS.
async fn held_locks(
    backend_name: &str,
    connect: Connect,
    probe: &dyn Probe,
    pool: &Pool,
    settings: &Settings,
    report: &mut Report,
) {
    let n = settings.held;
    let conns_before = settled_connections(probe, settings).await;
    sys::trim_heap();
    let rss_before = sys::rss();
    let counting = Arc::new(Counting::new(connect.await));
    let locker = harness::locker(counting.clone(), settings.renew_ttl);
    // The TTL the store enforces (a session store: its session timeout).
    let ttl = counting
        .capabilities()
        .effective_ttl(settings.renew_ttl)
        .map_or(settings.renew_ttl, |t| t.get());
    let every = ttl / 3;
    let scenario = format!(
        "{} locks held through one Locker, TTL {ttl:?}, renewed every {every:?}",
        harness_count(n)
    );

    let deadline = Instant::now() + settings.deadline;
    let errors = AtomicUsize::new(0);
    let taking = Instant::now();
    let guards: Vec<LockGuard> = stream::iter(0..n)
        .map(|i| {
            let locker = locker.clone();
            async move {
                let name = format!("bench/held/{i}");
                tokio::time::timeout_at(deadline, locker.try_acquire(name.as_str())).await
            }
        })
        .buffer_unordered(64)
        .filter_map(|taken| {
            let errors = &errors;
            async move {
                match taken {
                    Ok(Ok(Some(guard))) => Some(guard),
                    Ok(Ok(None)) | Err(_) => None,
                    Ok(Err(e)) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("{backend_name}: acquiring a held lock failed: {e}");
                        }
                        None
                    }
                }
            }
        })
        .collect()
        .await;
    let took = taking.elapsed();

    // Let the renewer converge on one batch per interval.
    tokio::time::sleep(every * 2).await;
    let own = own_requests(probe).await;
    // At least two renew intervals, so the window holds whole ticks.
    let window = settings.renew_window.max(every * 2);
    let (requests0, batches0, leases0) = (
        probe.requests().await,
        counting.batches.load(Ordering::Relaxed),
        counting.renewed.load(Ordering::Relaxed),
    );
    let (cpu0, store0) = (sys::own_cpu(), store_cpu(probe));
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = started.elapsed();
    let (cpu1, store_share) = (sys::own_cpu(), store_share(store0, probe, elapsed));
    let requests1 = probe.requests().await;
    let ticks = counting.batches.load(Ordering::Relaxed) - batches0;
    let leases = counting.renewed.load(Ordering::Relaxed) - leases0;
    let rss = sys::rss();
    let conns = match (conns_before, probe.connections().await) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    let held = guards.len();

    let per_tick = match (requests0, requests1) {
        (Some(a), Some(b)) if ticks > 0 => {
            Some(b.saturating_sub(a).saturating_sub(own) as f64 / ticks as f64)
        }
        _ => None,
    };
    let per_conn = per_tick.zip(conns).map(|(r, c)| r / c.max(1) as f64);
    let cpu = cpu1.saturating_sub(cpu0);
    let cpu_share = cpu.as_secs_f64() / elapsed.as_secs_f64().max(1e-9);

    let releasing = Instant::now() + settings.deadline;
    let outcomes: Vec<_> = stream::iter(guards)
        .map(|g| tokio::time::timeout_at(releasing, g.release()))
        .buffer_unordered(64)
        .collect()
        .await;
    let released = outcomes
        .iter()
        .filter(|r| matches!(r, Ok(Ok(ReleaseOutcome::Released))))
        .count();
    let gone = outcomes
        .iter()
        .filter(|r| matches!(r, Ok(Ok(ReleaseOutcome::NotHeld))))
        .count();

    let errors = errors.into_inner();
    let mut result = format!(
        "{held}/{n} taken in {:.1} s, {lost} lost in the window, {released} released ({gone} no longer held); {ticks} renew ticks in {:.1} s ({} leases)",
        took.as_secs_f64(),
        elapsed.as_secs_f64(),
        harness_count(leases as usize),
    );
    if errors > 0 {
        result.push_str(&format!("; {errors} acquire errors"));
    }
    if held < n {
        result.push_str(&format!(
            "; not all taken in {:.0} s",
            settings.deadline.as_secs_f64()
        ));
    }
    let round_trips = match per_tick {
        Some(r) => format!("{r:.1} {} per tick", probe.unit()),
        None if ticks == 0 => "no renew tick in the window".into(),
        None => format!("n/a ({ticks} renew_many calls)"),
    };
    let connections = format!(
        "{} (pool: {} = {})",
        conns.map_or("n/a".into(), |c| c.to_string()),
        pool.size,
        pool.what
    );
    report.scale.push(ScaleRow {
        backend: backend_name.to_string(),
        scenario,
        ran: held > 0 && ticks > 0,
        result,
        round_trips,
        connections,
        client_cpu: sys::share(cpu, elapsed),
        store_cpu: store_share,
        rss: growth(rss, rss_before),
    });
    let complete = held == n && lost == 0 && gone == 0;
    report.verdict(Verdict::new(
        backend_name,
        format!(
            "{} held locks: ≤ 1 store round trip per renew tick per connection",
            harness_count(n)
        ),
        match (per_tick, per_conn) {
            (Some(t), Some(c)) => format!(
                "{t:.1} per tick over {} connections = {c:.1}",
                conns.unwrap_or(0)
            ),
            _ => "not countable on this store".into(),
        },
        per_conn.map(|c| c <= 1.0 && complete),
    ));
    report.verdict(Verdict::new(
        backend_name,
        format!(
            "{} held locks: client CPU < 5% of one core",
            harness_count(n)
        ),
        format!(
            "{:.1}%{}",
            cpu_share * 100.0,
            if complete { "" } else { " (not all held)" }
        ),
        Some(cpu_share < 0.05 && complete),
    ));
}

/// Scenario (b): `settings.waiters` waiters on one name in one process
/// through one `Locker`; each acquires, holds briefly, releases. The store's
/// connections (peak, sampled), peak RSS, and the time until all are served.
async fn waiters(
    backend_name: &str,
    connect: Connect,
    probe: &dyn Probe,
    pool: &Pool,
    settings: &Settings,
    report: &mut Report,
) {
    let n = settings.waiters;
    let scenario = format!(
        "{} waiters on one name through one Locker, each holds {:?}",
        harness_count(n),
        settings.hold
    );
    let conns_before = settled_connections(probe, settings).await;
    let locker = harness::locker(connect.await, settings.ttl);
    let own = own_requests(probe).await;
    let requests0 = probe.requests().await;
    sys::trim_heap();
    let rss_before = sys::rss();
    let peak_reset = sys::reset_peak_rss();
    let (cpu0, store0) = (sys::own_cpu(), store_cpu(probe));
    let started = Instant::now();
    let deadline = started + settings.deadline;
    let served = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let acquire_errors = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (locker, served, errors, acquire_errors, hold) = (
            locker.clone(),
            served.clone(),
            errors.clone(),
            acquire_errors.clone(),
            settings.hold,
        );
        let name = backend_name.to_string();
        tasks.spawn(async move {
            let wait = deadline.saturating_duration_since(Instant::now());
            match locker.acquire_timeout("bench/waiters", wait).await {
                Ok(guard) => {
                    tokio::time::sleep(hold).await;
                    if let Err(e) = guard.release().await
                        && errors.fetch_add(1, Ordering::Relaxed) == 0
                    {
                        eprintln!("{name}: a waiter's release failed: {e}");
                    }
                    served.fetch_add(1, Ordering::Relaxed);
                }
                Err(LockError::Timeout { .. }) => {}
                Err(e) => {
                    if acquire_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("{name}: a waiter's acquire failed: {e}");
                    }
                }
            }
        });
    }
    // Sample the server's connections while the waiters are at it.
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampling = {
        let (done, peak) = (done.clone(), peak.clone());
        async move {
            while !done.load(Ordering::Relaxed) {
                if let Some(c) = probe.connections().await {
                    peak.fetch_max(c, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let joining = async {
        let hard_stop = deadline + Duration::from_secs(5);
        let all = async { while tasks.join_next().await.is_some() {} };
        let finished = tokio::time::timeout_at(hard_stop, all).await.is_ok();
        tasks.abort_all();
        done.store(true, Ordering::Relaxed);
        finished
    };
    let (_, _finished) = tokio::join!(sampling, joining);
    let elapsed = started.elapsed();
    let cpu = sys::own_cpu().saturating_sub(cpu0);
    let store_share = store_share(store0, probe, elapsed);
    let requests1 = probe.requests().await;
    let served = served.load(Ordering::Relaxed);
    let errors = errors.load(Ordering::Relaxed);
    let acquire_errors = acquire_errors.load(Ordering::Relaxed);
    let peak_rss = if peak_reset { sys::peak_rss() } else { None };
    let conns = conns_before.map(|b| peak.load(Ordering::Relaxed).saturating_sub(b));

    let all_served = served == n;
    let mut result = if all_served {
        format!("all {served} served in {:.2} s", elapsed.as_secs_f64())
    } else {
        format!(
            "not all served in {:.0} s: {served}/{n}",
            settings.deadline.as_secs_f64()
        )
    };
    if acquire_errors > 0 {
        result.push_str(&format!("; {acquire_errors} acquire errors"));
    }
    if errors > 0 {
        result.push_str(&format!("; {errors} release errors"));
    }
    let per_grant = match (requests0, requests1) {
        (Some(a), Some(b)) if served > 0 => {
            Some(b.saturating_sub(a).saturating_sub(own) as f64 / served as f64)
        }
        _ => None,
    };
    report.scale.push(ScaleRow {
        backend: backend_name.to_string(),
        scenario,
        ran: served > 0,
        result: result.clone(),
        round_trips: per_grant.map_or("n/a".into(), |r| {
            format!("{r:.1} {} per grant", probe.unit())
        }),
        connections: format!(
            "peak {} (pool: {} = {})",
            conns.map_or("n/a".into(), |c| c.to_string()),
            pool.size,
            pool.what
        ),
        client_cpu: sys::share(cpu, elapsed),
        store_cpu: store_share,
        rss: format!("peak {}", growth(peak_rss, rss_before)),
    });
    report.verdict(Verdict::new(
        backend_name,
        format!(
            "{} waiters: all served, server connections ≤ pool size",
            harness_count(n)
        ),
        format!(
            "{result}; peak connections {} (pool {})",
            conns.map_or("n/a".into(), |c| c.to_string()),
            pool.size
        ),
        Some(all_served && conns.is_none_or(|c| c <= pool.size)),
    ));
}

/// "212.3 MiB (+12.0 MiB)": a reading and its growth over the scenario's start.
fn growth(now: Option<u64>, before: Option<u64>) -> String {
    match (now, before) {
        (Some(n), Some(b)) => format!(
            "{} (+{:.1} MiB)",
            bytes(Some(n)),
            n.saturating_sub(b) as f64 / (1024.0 * 1024.0)
        ),
        _ => bytes(now),
    }
}

/// "10,000".
fn harness_count(n: usize) -> String {
    crate::report::thousands(n as f64)
}

/// A backend that counts the renewer's batches, and forwards everything.
#[derive(Debug)]
pub(crate) struct Counting {
    inner: Arc<dyn LockBackend>,
    /// `renew_many` calls: the renewer's ticks that renewed something.
    batches: AtomicU64,
    /// Leases in those calls.
    renewed: AtomicU64,
}

impl Counting {
    pub(crate) fn new(inner: Arc<dyn LockBackend>) -> Self {
        Counting {
            inner,
            batches: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl LockBackend for Counting {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.inner.try_acquire(request).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.inner.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.renewed
            .fetch_add(leases.len() as u64, Ordering::Relaxed);
        self.inner.renew_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        self.inner.inspect(name).await
    }
    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.evict(name, expected).await
    }
    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch(name).await
    }
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.inner.acquire(request, wait).await
    }
    async fn try_acquire_permit(
        &self,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        self.inner.try_acquire_permit(request, permits).await
    }
    async fn acquire_permit(
        &self,
        request: &LockRequest,
        permits: u32,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.inner.acquire_permit(request, permits, wait).await
    }
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        self.inner.inspect_permits(name).await
    }
    async fn watch_permits(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch_permits(name).await
    }
    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.inner.raise_fence_floor(floor).await
    }
}
