//! The results: rows, scale scenarios, targets, the stores and the machine,
//! rendered as one Markdown document.

use std::fmt::Write as _;
use std::time::Duration;

use crate::harness::{Contended, Stats};
use crate::limit::{self, OneWrite};
use crate::sys;

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One request to the store and its reply.
    RoundTrip,
    /// The store's own floor for the operation: the same round trips and
    /// the same durability, no lock logic.
    Floor,
    /// `LockBackend` called directly.
    Trait,
    /// `Locker` / `LockGuard`: what applications call.
    Locker,
    /// Another library's lock on the same store.
    Peer,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::RoundTrip => "round trip",
            Kind::Floor => "floor",
            Kind::Trait => "trait",
            Kind::Locker => "**Locker**",
            Kind::Peer => "peer",
        }
    }
}

/// One line of the main table.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub backend: String,
    pub kind: Kind,
    pub what: String,
    pub ops: usize,
    pub per_sec: f64,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
    pub note: String,
    /// The backend cannot do what the row measures (no number, no sample
    /// expected).
    pub unsupported: bool,
}

impl Row {
    pub(crate) fn new(backend: &str, kind: Kind, what: impl Into<String>, stats: &Stats) -> Self {
        Row {
            backend: backend.to_string(),
            kind,
            what: what.into(),
            ops: stats.samples.len(),
            per_sec: stats.per_sec(),
            p50: stats.p50(),
            p99: stats.percentile(0.99),
            note: String::new(),
            unsupported: false,
        }
    }

    /// A row the backend cannot run: "unsupported" instead of numbers.
    pub(crate) fn unsupported(backend: &str, kind: Kind, what: impl Into<String>) -> Self {
        Row {
            unsupported: true,
            ..Row::new(backend, kind, what, &Stats::default())
        }
    }

    /// A contended row: acquisitions/s, hand-off p50/p99, fairness.
    pub(crate) fn contended(
        backend: &str,
        kind: Kind,
        what: impl Into<String>,
        c: &Contended,
    ) -> Self {
        Row {
            backend: backend.to_string(),
            kind,
            what: what.into(),
            ops: c.grants(),
            per_sec: c.per_sec(),
            p50: c.handoffs.p50(),
            p99: c.handoffs.percentile(0.99),
            note: c.fairness(),
            unsupported: false,
        }
    }

    pub(crate) fn note(mut self, note: impl AsRef<str>) -> Self {
        let note = note.as_ref();
        if !note.is_empty() {
            if !self.note.is_empty() {
                self.note.push_str("; ");
            }
            self.note.push_str(note);
        }
        self
    }
}

/// One line of the scale table.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScaleRow {
    pub backend: String,
    pub scenario: String,
    /// Something happened (a lock held, a waiter served): the smoke check.
    pub ran: bool,
    pub result: String,
    pub round_trips: String,
    pub connections: String,
    pub client_cpu: String,
    pub store_cpu: String,
    pub rss: String,
}

/// One target and where a backend stands.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub backend: String,
    pub target: String,
    pub measured: String,
    /// `None`: not applicable or not measurable here.
    pub met: Option<bool>,
}

impl Verdict {
    pub(crate) fn new(
        backend: &str,
        target: impl Into<String>,
        measured: impl Into<String>,
        met: Option<bool>,
    ) -> Self {
        Verdict {
            backend: backend.to_string(),
            target: target.into(),
            measured: measured.into(),
            met,
        }
    }
}

/// A store's version and durability settings, as read from it.
#[derive(Debug, Clone)]
pub(crate) struct StoreInfo {
    pub backend: String,
    pub version: String,
    pub settings: String,
}

/// Everything one backend (or the whole run) measured.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub rows: Vec<Row>,
    pub scale: Vec<ScaleRow>,
    pub verdicts: Vec<Verdict>,
    pub stores: Vec<StoreInfo>,
    /// Contended rates next to each floor's one-write limit.
    pub limits: Vec<OneWrite>,
    /// Sections that failed, with why.
    pub failures: Vec<String>,
}

impl Report {
    pub(crate) fn row(&mut self, row: Row) {
        self.rows.push(row);
    }

    pub(crate) fn verdict(&mut self, v: Verdict) {
        self.verdicts.push(v);
    }

    pub(crate) fn store(
        &mut self,
        backend: &str,
        version: impl Into<String>,
        settings: impl Into<String>,
    ) {
        self.stores.push(StoreInfo {
            backend: backend.to_string(),
            version: version.into(),
            settings: settings.into(),
        });
    }

    pub(crate) fn extend(&mut self, other: Report) {
        self.rows.extend(other.rows);
        self.scale.extend(other.scale);
        self.verdicts.extend(other.verdicts);
        self.stores.extend(other.stores);
        self.limits.extend(other.limits);
        self.failures.extend(other.failures);
    }

    /// What a smoke run checks: every section finished, every row has at
    /// least one sample, every scenario did something.
    pub(crate) fn incomplete(&self) -> Vec<String> {
        let mut missing = self.failures.clone();
        for r in &self.rows {
            if r.ops == 0 && !r.unsupported {
                missing.push(format!("{} / {}: no sample", r.backend, r.what));
            }
        }
        for s in &self.scale {
            if !s.ran {
                missing.push(format!("{} / {}: did not run", s.backend, s.scenario));
            }
        }
        missing
    }

    /// The whole document (bench/RESULTS.md): what is measured and how to
    /// read it, then the run, the stores, every row, the one-write limit
    /// (with the chart at `chart`, its link from the document, if written),
    /// the scale scenarios and the targets.
    pub(crate) fn markdown(&self, run: &RunInfo, chart: Option<&str>) -> String {
        let mut md = String::from(INTRO);
        let _ = writeln!(md, "\n## Results\n\n### Machine and run\n");
        let _ = writeln!(md, "- Command: `{}`", run.command);
        let _ = writeln!(md, "- Date: {}", run.date);
        let _ = writeln!(md, "- {}", run.machine);
        let _ = writeln!(
            md,
            "- Load average (1/5/15 min): {} at start, {} at the end",
            run.load_start, run.load_end
        );
        let _ = writeln!(md, "- {}", run.settings);
        if !self.stores.is_empty() {
            let _ = writeln!(md, "\n| store | version | durability |\n|---|---|---|");
            for s in &self.stores {
                let _ = writeln!(md, "| {} | {} | {} |", s.backend, s.version, s.settings);
            }
        }
        self.render_rows(&mut md);
        limit::render(&mut md, &self.limits, chart);
        self.render_rest(&mut md);
        md
    }

    fn render_rows(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "\n### Lock cycles and hand-off\n\n\
             Uncontended rows: acquire + release cycles/s and cycle latency. \
             Contended rows: acquisitions/s, and hand-off latency (a holder \
             starts its release → the next holder has the grant). Permit \
             rows: a semaphore's acquire + release cycles, uncontended. \
             Leader hand-over: the leader's `resign()` → the waiting \
             candidate's `campaign` returns (no rate: each waits for its \
             candidate to be in line).\n"
        );
        let _ = writeln!(
            md,
            "| backend | kind | measurement | ops/s | p50 | p99 | notes |\n|---|---|---|--:|--:|--:|---|"
        );
        for r in &self.rows {
            let per_sec = if r.unsupported {
                "unsupported".into()
            } else {
                thousands(r.per_sec)
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.backend,
                r.kind.label(),
                r.what,
                per_sec,
                duration(r.p50),
                duration(r.p99),
                r.note
            );
        }
    }

    fn render_rest(&self, md: &mut String) {
        if !self.scale.is_empty() {
            let _ = writeln!(
                md,
                "\n### Scale\n\n\
                 | backend | scenario | result | store round trips | server connections | client CPU | store CPU | client RSS |\n\
                 |---|---|---|---|---|---|---|---|"
            );
            for s in &self.scale {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    s.backend,
                    s.scenario,
                    s.result,
                    s.round_trips,
                    s.connections,
                    s.client_cpu,
                    s.store_cpu,
                    s.rss
                );
            }
        }
        if !self.verdicts.is_empty() {
            let _ = writeln!(
                md,
                "\n### Targets\n\n| backend | target | measured | met |\n|---|---|---|---|"
            );
            for v in &self.verdicts {
                let met = match v.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "n/a",
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} |",
                    v.backend, v.target, v.measured, met
                );
            }
        }
        if !self.failures.is_empty() {
            let _ = writeln!(md, "\n### Failed sections\n");
            for f in &self.failures {
                let _ = writeln!(md, "- {f}");
            }
        }
    }
}

/// The top of the document: it stands alone (the README only links to it),
/// so it says what each row measures and which numbers to trust.
const INTRO: &str = "\
# distlock benchmark results

Generated by `cargo run --release -p distlock-bench --all-features -- --markdown bench/RESULTS.md`
(do not edit by hand). One command launches each store (as the tests do) and measures every
backend built in, in one run, against the same stores with the same settings.

Per backend: the store's own round trip and its floor (the same two round trips with the same
durability, no lock logic); uncontended acquire + release through the trait and through `Locker`
(what applications call: the guard, the renewer, the wait loop); a peer on the same store where
one exists (`rslock` on Redis, `pg_advisory_lock` on PostgreSQL, etcd's Lock RPC, the
`zookeeper-client` lock recipe); N-way contention (acquisitions/s, hand-off p50/p99, the share of
grants that go straight back to the client that just released, per-client minimum and maximum);
the store's requests per lock cycle by its own count; and two scale scenarios through one
`Locker`: many held locks renewed at a short TTL (store requests per renew tick, client and store
CPU, client RSS) and many waiters on one name (server connections, peak RSS, time until all are
served, within a deadline). Each contended rate is also set against the store's one-write limit
(one durable write per hand-off = 2 x the floor's cycles/s), in a table and in a chart
(`contended.svg` beside this file) that the same run writes. The kinds compared take turns in
slices, so load from other processes hits them alike. `--smoke` runs every row once with tiny sizes (CI does, checking only that each
ran); `--help` lists the sizes and run lengths.

## How to read it

Every durable write waits for an fsync, so absolute numbers follow the disk and the machine's load
(the run records the load average); the ratios are what compare. On a VM shared with other builds
an fsync can take 0.2 ms or 20 ms from one second to the next, so the durable stores' uncontended
ratios swing between runs (PostgreSQL's Locker row measured 0.32x and 1.23x its floor in two runs
of the same build; a ratio above 1 means the floor's turns met slower disks, not that a lock beats
its floor). The stable signals are the rows without fsync (Redis without persistence, memory), the
store's own request counts, and the scale scenarios. For every target a run misses,
[PROFILES.md](PROFILES.md) says where the time goes (server time per call, WAL per statement,
client CPU, requests per tick) and which guarantee the remaining cost pays for.
";

/// The run and the machine it ran on.
#[derive(Debug, Clone)]
pub(crate) struct RunInfo {
    pub command: String,
    pub date: String,
    pub machine: String,
    pub settings: String,
    pub load_start: String,
    pub load_end: String,
}

impl RunInfo {
    pub(crate) fn start(command: String, settings: String) -> Self {
        RunInfo {
            command,
            date: sys::date_utc(),
            machine: sys::machine(),
            settings,
            load_start: sys::loadavg(),
            load_end: String::new(),
        }
    }
}

/// "12,345", "0.52" for small rates.
pub(crate) fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    if x < 10.0 {
        return format!("{x:.2}");
    }
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "0.412 ms", "12 µs", "1.20 s".
pub(crate) fn duration(d: Option<Duration>) -> String {
    match d {
        None => "-".into(),
        Some(d) if d < Duration::from_micros(100) => format!("{} µs", d.as_micros()),
        Some(d) if d < Duration::from_secs(1) => format!("{:.3} ms", d.as_secs_f64() * 1e3),
        Some(d) => format!("{:.2} s", d.as_secs_f64()),
    }
}

/// "1.2 MiB".
pub(crate) fn bytes(b: Option<u64>) -> String {
    match b {
        None => "n/a".into(),
        Some(b) => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_row_says_so_and_is_not_missing() {
        let mut report = Report::default();
        report.row(Row::unsupported("old-store", Kind::Locker, "permits"));
        assert!(report.incomplete().is_empty());
        report.row(Row::new(
            "old-store",
            Kind::Locker,
            "locks",
            &Stats::default(),
        ));
        assert_eq!(report.incomplete().len(), 1);
        let run = RunInfo {
            command: String::new(),
            date: String::new(),
            machine: String::new(),
            settings: String::new(),
            load_start: String::new(),
            load_end: String::new(),
        };
        let md = report.markdown(&run, None);
        assert!(
            md.contains("| old-store | **Locker** | permits | unsupported | - | - |"),
            "{md}"
        );
        // The document stands alone (the README only links to it): it says
        // what it measured and how to read it before the numbers.
        assert!(md.starts_with("# distlock benchmark results\n"), "{md}");
        let how = md.find("How to read it").expect("a how-to-read section");
        assert!(
            how < md.find("### Machine and run").expect("the run"),
            "{md}"
        );
    }
}
