//! The two scale scenarios, through one `Locker` as an application would
//! use it: many held locks kept alive by the renewer, and many waiters on
//! one name. The store is asked what it served (its own counters) and how
//! many connections it has; the kernel, what each side spent in CPU.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use lockcore::backend::wait::{WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockRequest, async_trait};
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
    /// How long after a request the server's count may still leave it out
    /// (a store that reports its counters lazily): readings that follow
    /// client work wait this long first.
    fn lag(&self) -> Duration {
        Duration::ZERO
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

mod held;
mod waiters;

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
    held::held_locks(backend, connect(), probe, &pool, settings, &mut report).await;
    waiters::waiters(backend, connect(), probe, &pool, settings, &mut report).await;
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

/// The server's count once it includes every request sent so far: read
/// after the probe's [`lag`](Probe::lag) (not waited in a smoke run, whose
/// numbers mean nothing).
async fn settled_requests(probe: &dyn Probe, settings: &Settings) -> Option<u64> {
    if !settings.smoke {
        tokio::time::sleep(probe.lag()).await;
    }
    probe.requests().await
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
    let mut cycles = Vec::new();
    for (label, client) in kinds {
        let cycle = harness::cycle(client);
        cycle().await; // a first use may set things up (a subscription)
        cycles.push((label, cycle));
    }
    let mut counts = Vec::new();
    let mut before = settled_requests(probe, settings).await;
    for (label, cycle) in cycles {
        for _ in 0..n {
            cycle().await;
        }
        let after = settled_requests(probe, settings).await;
        if let (Some(a), Some(b)) = (before, after) {
            let per = b.saturating_sub(a).saturating_sub(own) as f64 / f64::from(n);
            counts.push(format!("{label} {per:.1}"));
        }
        before = after;
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
