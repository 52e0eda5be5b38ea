//! `cargo run --release -p distlock-bench --all-features -- --markdown bench/RESULTS.md`
//!
//! For every backend built in, in one run against the same stores: the
//! store's round trip and its floor (the same round trips with the same
//! durability, no lock logic), lock cycles through the trait and through
//! `Locker` (what applications call), a semaphore's permits through
//! `Locker`, peers (another library's lock on the same store), N-way
//! contention with hand-off times and fairness, leader hand-overs, and two
//! scale scenarios (many held locks renewed by one `Locker`; many waiters on
//! one name). Prints a Markdown report with the machine and the stores, and
//! where each backend stands against its targets. With `--markdown`, the
//! contended chart (`contended.svg`, contended grants/s against one durable
//! write per hand-off) is written next to the report and embedded in it.
//!
//! `--smoke` runs every row once with tiny sizes and only checks that each
//! ran (CI); it says nothing about speed. Stores are launched by the
//! conformance launcher unless a `LOCK_TEST_*` variable points at one.

mod chart;
#[cfg(feature = "etcd")]
mod etcd;
mod harness;
mod limit;
mod lineup;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod report;
mod scale;
#[cfg(feature = "sqlite")]
mod sqlite;
mod sys;
#[cfg(feature = "zookeeper")]
mod zookeeper;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::report::{Report, RunInfo};

/// Every backend, in the order they run.
const BACKENDS: &[&str] = &["memory", "sqlite", "redis", "postgres", "etcd", "zookeeper"];

#[derive(Debug, Parser)]
#[command(
    name = "distlock-bench",
    about = "Lock cycles, contention and scale for every distlock backend, next to each store's floor and peers"
)]
struct Cli {
    /// Backends to run (default: all built in): memory, sqlite, redis, postgres, etcd, zookeeper.
    backends: Vec<String>,
    /// Every row once with tiny sizes, checking only that each ran (for CI).
    #[arg(long)]
    smoke: bool,
    /// Also write the Markdown report to this file (bench/RESULTS.md; the
    /// README links to it).
    #[arg(long, value_name = "PATH")]
    markdown: Option<PathBuf>,
    /// Write the contended chart (SVG) to this file [default: contended.svg
    /// next to the --markdown file]; the report embeds it.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
    /// Seconds each measurement runs (the kinds compared take turns within it).
    #[arg(long, env = "BENCH_SECS", default_value_t = 3.0)]
    secs: f64,
    /// Clients in the contended rows.
    #[arg(long, env = "BENCH_CONTENDERS", default_value_t = 16)]
    contenders: usize,
    /// Locks held in the renewal scenario.
    #[arg(long, default_value_t = 10_000)]
    held: usize,
    /// Lease TTL in the renewal scenario (renewed every third of it).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    renew_ttl: Duration,
    /// How long the renewal scenario is measured.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    renew_window: Duration,
    /// Waiters on one name in the waiters scenario.
    #[arg(long, default_value_t = 2_000)]
    waiters: usize,
    /// Hard deadline of each scenario phase.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    deadline: Duration,
}

/// Run lengths and sizes.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tiny sizes, every row once (`--smoke`).
    pub smoke: bool,
    /// Warm-up before a comparison, split among its kinds.
    pub warmup: Duration,
    /// Each kind's total time in a comparison.
    pub run: Duration,
    /// Turns the kinds of a comparison take.
    pub slices: u32,
    /// Clients contending in the contention rows.
    pub contenders: usize,
    /// Lease TTL of the cycle and contention rows.
    pub ttl: Duration,
    /// Locks held in the renewal scenario.
    pub held: usize,
    /// Their TTL.
    pub renew_ttl: Duration,
    /// How long the renewal scenario measures.
    pub renew_window: Duration,
    /// Waiters on one name in the waiters scenario.
    pub waiters: usize,
    /// How long each waiter holds the lock.
    pub hold: Duration,
    /// Hard deadline of each scenario phase.
    pub deadline: Duration,
}

impl Settings {
    fn from_cli(cli: &Cli) -> Settings {
        if cli.smoke {
            return Settings {
                smoke: true,
                warmup: Duration::ZERO,
                run: Duration::from_millis(100),
                slices: 2,
                contenders: 4,
                ttl: Duration::from_secs(10),
                held: 50,
                // The shortest TTL every store accepts (etcd: 1 s).
                renew_ttl: Duration::from_secs(1),
                renew_window: Duration::from_millis(700),
                waiters: 20,
                hold: Duration::from_millis(1),
                deadline: Duration::from_secs(20),
            };
        }
        let run = Duration::from_secs_f64(cli.secs.max(0.01));
        Settings {
            smoke: false,
            warmup: run / 3,
            run,
            slices: 6,
            contenders: cli.contenders.max(2),
            ttl: Duration::from_secs(10),
            held: cli.held.max(1),
            renew_ttl: cli.renew_ttl,
            renew_window: cli.renew_window,
            waiters: cli.waiters.max(1),
            hold: Duration::from_millis(1),
            deadline: cli.deadline,
        }
    }

    fn describe(&self) -> String {
        let features: Vec<&str> = [
            ("sqlite", cfg!(feature = "sqlite")),
            ("redis", cfg!(feature = "redis")),
            ("postgres", cfg!(feature = "postgres")),
            ("etcd", cfg!(feature = "etcd")),
            ("zookeeper", cfg!(feature = "zookeeper")),
        ]
        .into_iter()
        .filter_map(|(f, on)| on.then_some(f))
        .collect();
        format!(
            "Build: {}, features [{}]. {}: {:?} per measurement in {} turns (warm-up {:?}), {} contenders, lock TTL {:?}; \
             scale: {} held locks at TTL {:?} measured over {:?}, {} waiters each holding {:?}, deadline {:?} per phase",
            if cfg!(debug_assertions) {
                "debug (numbers not comparable)"
            } else {
                "release"
            },
            features.join(", "),
            if self.smoke { "Smoke run" } else { "Settings" },
            self.run,
            self.slices,
            self.warmup,
            self.contenders,
            self.ttl,
            self.held,
            self.renew_ttl,
            self.renew_window,
            self.waiters,
            self.hold,
            self.deadline,
        )
    }
}

/// Runs one backend's section on its own task: a panic (a store error the
/// bench cannot go on from) fails that section, not the run.
async fn section<F>(name: &str, fut: F) -> Report
where
    F: Future<Output = Report> + Send + 'static,
{
    eprintln!("distlock-bench: {name} ...");
    let started = std::time::Instant::now();
    let report = match tokio::spawn(fut).await {
        Ok(report) => report,
        Err(e) => {
            let why = match e.try_into_panic() {
                Ok(panic) => panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into()),
                Err(e) => e.to_string(),
            };
            Report {
                failures: vec![format!("{name}: {why}")],
                ..Report::default()
            }
        }
    };
    eprintln!(
        "distlock-bench: {name} done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    report
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    for b in &cli.backends {
        if !BACKENDS.contains(&b.as_str()) {
            eprintln!(
                "distlock-bench: unknown backend {b:?}; known: {}",
                BACKENDS.join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let settings = Settings::from_cli(&cli);
    let wants = |b: &str| cli.backends.is_empty() || cli.backends.iter().any(|w| w == b);
    let command = std::iter::once("distlock-bench".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let mut run = RunInfo::start(command, settings.describe());
    let mut report = Report::default();

    if wants("memory") {
        report.extend(section("memory", memory::run(settings.clone())).await);
    }
    #[cfg(feature = "sqlite")]
    if wants("sqlite") {
        report.extend(section("sqlite", sqlite::run(settings.clone())).await);
    }
    #[cfg(feature = "redis")]
    if wants("redis") {
        report.extend(section("redis", redis::run(settings.clone())).await);
    }
    #[cfg(feature = "postgres")]
    if wants("postgres") {
        report.extend(section("postgres", postgres::run(settings.clone())).await);
    }
    #[cfg(feature = "etcd")]
    if wants("etcd") {
        report.extend(section("etcd", etcd::run(settings.clone())).await);
    }
    #[cfg(feature = "zookeeper")]
    if wants("zookeeper") {
        report.extend(section("zookeeper", zookeeper::run(settings.clone())).await);
    }
    for b in BACKENDS {
        if wants(b) && !cli.backends.is_empty() && !built_in(b) {
            report
                .failures
                .push(format!("{b}: not built in (enable the `{b}` feature)"));
        }
    }

    run.load_end = sys::loadavg();
    let svg = cli.svg.clone().or_else(|| {
        cli.markdown
            .as_ref()
            .map(|md| md.with_file_name("contended.svg"))
    });
    let link = svg
        .as_deref()
        .map(|svg| chart_link(svg, cli.markdown.as_deref()));
    let markdown = report.markdown(&run, link.as_deref());
    println!("{markdown}");
    let files = [(svg, chart::svg(&report.limits)), (cli.markdown, markdown)];
    for (path, text) in &files {
        if let Some(path) = path
            && let Err(e) = std::fs::write(path, text)
        {
            eprintln!("distlock-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    let incomplete = report.incomplete();
    if !incomplete.is_empty() {
        eprintln!("distlock-bench: not every row ran:");
        for m in &incomplete {
            eprintln!("  - {m}");
        }
        return ExitCode::FAILURE;
    }
    if settings.smoke {
        eprintln!(
            "distlock-bench: smoke run complete: {} rows, {} scenarios ran",
            report.rows.len(),
            report.scale.len()
        );
    }
    ExitCode::SUCCESS
}

/// The chart's link from the report: its file name when both are in one
/// folder (bench/RESULTS.md → contended.svg), else its path as given.
fn chart_link(svg: &Path, markdown: Option<&Path>) -> String {
    match (svg.file_name(), markdown) {
        (Some(name), Some(md)) if svg.parent() == md.parent() => name.to_string_lossy().into(),
        _ => svg.display().to_string(),
    }
}

fn built_in(backend: &str) -> bool {
    [
        ("memory", true),
        ("sqlite", cfg!(feature = "sqlite")),
        ("redis", cfg!(feature = "redis")),
        ("postgres", cfg!(feature = "postgres")),
        ("etcd", cfg!(feature = "etcd")),
        ("zookeeper", cfg!(feature = "zookeeper")),
    ]
    .contains(&(backend, true))
}
