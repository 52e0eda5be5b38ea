//! Backend-independent measurements: uncontended cycles, a raw floor, and
//! contended hand-off. Every backend module feeds these the same way.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::{LockBackend, LockName, WaitPolicy};
use tokio::time::Instant;

/// One line of the results table.
#[derive(Debug, Clone)]
pub struct Row {
    pub backend: &'static str,
    pub scenario: String,
    pub per_sec: f64,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
    pub note: String,
}

impl Row {
    pub fn new(backend: &'static str, scenario: impl Into<String>, stats: &Stats) -> Self {
        Row {
            backend,
            scenario: scenario.into(),
            per_sec: stats.per_sec(),
            p50: stats.percentile(0.50),
            p99: stats.percentile(0.99),
            note: String::new(),
        }
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// Completed operations and their latencies over a run.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub elapsed: Duration,
    pub samples: Vec<Duration>,
}

impl Stats {
    pub fn per_sec(&self) -> f64 {
        self.samples.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn percentile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted = self.samples.clone();
        sorted.sort();
        let at = ((sorted.len() - 1) as f64 * q).round() as usize;
        Some(sorted[at])
    }
}

/// Runs `op` back to back for `run` (after `warmup`), timing each call.
pub async fn timed<F, Fut>(warmup: Duration, run: Duration, mut op: F) -> Stats
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let warm_until = Instant::now() + warmup;
    while Instant::now() < warm_until {
        op().await;
    }
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < run {
        let t = Instant::now();
        op().await;
        samples.push(t.elapsed());
    }
    Stats {
        elapsed: started.elapsed(),
        samples,
    }
}

/// Uncontended `try_acquire` + `release` cycles on one name.
pub async fn uncontended(
    backend: Arc<dyn LockBackend>,
    name: &LockName,
    ttl: Duration,
    warmup: Duration,
    run: Duration,
) -> Stats {
    timed(warmup, run, || {
        let backend = backend.clone();
        async move {
            let lease = backend
                .try_acquire(name, ttl)
                .await
                .expect("acquire")
                .into_lease()
                .expect("uncontended lock must be free");
            backend.release(&lease).await.expect("release");
        }
    })
    .await
}

/// Result of a contended run.
#[derive(Debug, Default, Clone)]
pub struct Contended {
    /// Acquisitions and, as samples, their hand-off times: from the previous
    /// holder sending its release to the next holder having the grant.
    pub handoffs: Stats,
    /// Share of grants that went to the client that had waited longest.
    pub fifo_share: f64,
}

/// `clients.len()` clients loop acquire (waiting) / release on one name for `run`.
pub async fn contended(
    clients: Vec<Arc<dyn LockBackend>>,
    name: &LockName,
    ttl: Duration,
    run: Duration,
) -> Contended {
    struct Shared {
        released_at: Option<Instant>,
        handoffs: Vec<Duration>,
        waiting_since: Vec<Option<Instant>>,
        fifo_grants: usize,
        grants: usize,
    }
    let n = clients.len();
    let shared = Arc::new(Mutex::new(Shared {
        released_at: None,
        handoffs: Vec::new(),
        waiting_since: vec![None; n],
        fifo_grants: 0,
        grants: 0,
    }));
    let started = Instant::now();
    let stop_at = started + run;
    let mut tasks = Vec::new();
    for (i, backend) in clients.into_iter().enumerate() {
        let (shared, name) = (shared.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                shared.lock().unwrap().waiting_since[i] = Some(Instant::now());
                let policy = WaitPolicy::new(stop_at + Duration::from_secs(5));
                let Some(lease) = backend.acquire(&name, ttl, &policy).await.expect("acquire")
                else {
                    break;
                };
                let granted = Instant::now();
                {
                    let mut s = shared.lock().unwrap();
                    let mine = s.waiting_since[i].take();
                    let oldest = s.waiting_since.iter().flatten().min().copied();
                    if oldest.is_none_or(|o| mine.is_some_and(|m| m <= o)) {
                        s.fifo_grants += 1;
                    }
                    s.grants += 1;
                    if let Some(released) = s.released_at.take()
                        && granted < stop_at
                    {
                        s.handoffs.push(granted - released);
                    }
                    s.released_at = Some(Instant::now());
                }
                backend.release(&lease).await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    let s = shared.lock().unwrap();
    Contended {
        handoffs: Stats {
            elapsed: run,
            samples: s.handoffs.clone(),
        },
        fifo_share: s.fifo_grants as f64 / s.grants.max(1) as f64,
    }
}

/// Prints the table.
pub fn print(rows: &[Row]) {
    let fmt = |d: Option<Duration>| {
        d.map_or("-".to_string(), |d| {
            format!("{:.3} ms", d.as_secs_f64() * 1e3)
        })
    };
    println!(
        "{:<10} {:<44} {:>12} {:>11} {:>11}  note",
        "backend", "scenario", "ops/s", "p50", "p99"
    );
    for r in rows {
        println!(
            "{:<10} {:<44} {:>12.0} {:>11} {:>11}  {}",
            r.backend,
            r.scenario,
            r.per_sec,
            fmt(r.p50),
            fmt(r.p99),
            r.note
        );
    }
}
