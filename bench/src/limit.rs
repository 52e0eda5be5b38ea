//! The one-write limit of a contended lock: a hand-off needs at least one
//! durable write (the next holder's grant, which can carry the release),
//! and the floor's cycle makes two such writes, so one durable write per
//! hand-off is 2 x the floor's cycles/s. Each backend with a floor records
//! its contended rates here; the report's summary table, its targets and the
//! chart (`chart.rs`) read them.

use std::fmt::Write as _;
use std::time::Duration;

use crate::harness::ms;
use crate::report::{Kind, Verdict, duration, thousands};

/// Contended grants/s through `Locker` must reach this share of the limit.
pub(crate) const TARGET: f64 = 0.8;

/// Slack of the hand-off p50 target over one durable write and one
/// notification round trip.
const P50_SLACK: Duration = Duration::from_micros(500);

/// The note on a contended row, e.g. "0.45x one durable write per hand-off
/// (2 x the floor)".
pub(crate) fn note(per_sec: f64, floor_per_sec: f64) -> String {
    format!(
        "{:.2}x one durable write per hand-off (2 x the floor)",
        per_sec / (2.0 * floor_per_sec)
    )
}

/// One contended rate: distlock's `Locker`, the trait, or a peer.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    pub kind: Kind,
    pub label: String,
    pub per_sec: f64,
}

/// One backend's contended rates next to its one-write limit.
#[derive(Debug, Clone)]
pub(crate) struct OneWrite {
    pub backend: String,
    /// Clients contending.
    pub contenders: usize,
    /// The floor's cycles/s (two durable writes each), same run.
    pub floor_per_sec: f64,
    /// `Locker` first, then the trait, then the peers.
    pub bars: Vec<Bar>,
    /// Hand-off times through `Locker`.
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
}

impl OneWrite {
    /// One durable write per hand-off, per second.
    pub(crate) fn limit(&self) -> f64 {
        2.0 * self.floor_per_sec
    }

    pub(crate) fn share(&self, per_sec: f64) -> f64 {
        per_sec / self.limit()
    }

    fn locker(&self) -> Option<&Bar> {
        self.bars.iter().find(|b| b.kind == Kind::Locker)
    }

    /// The two targets: grants/s ≥ 0.8x the limit, and hand-off
    /// p50 ≤ one durable write (half the floor's p50) + one notification
    /// round trip (the store's round trip p50) + 0.5 ms.
    pub(crate) fn verdicts(
        &self,
        floor_p50: Option<Duration>,
        rtt_p50: Option<Duration>,
    ) -> Vec<Verdict> {
        let b = self.backend.as_str();
        let mut out = Vec::new();
        if let Some(locker) = self.locker() {
            let share = self.share(locker.per_sec);
            out.push(Verdict::new(
                b,
                format!(
                    "{}-way contended grants/s through Locker ≥ {TARGET:.1}x one durable write per hand-off (2 x the floor)",
                    self.contenders
                ),
                format!(
                    "{share:.2}x: {}/s vs {}/s",
                    thousands(locker.per_sec),
                    thousands(self.limit())
                ),
                Some(share >= TARGET),
            ));
        }
        let bound = match (floor_p50, rtt_p50) {
            (Some(floor), Some(rtt)) => Some(floor / 2 + rtt + P50_SLACK),
            _ => None,
        };
        out.push(Verdict::new(
            b,
            "hand-off p50 through Locker ≤ one durable write + one notification round trip + 0.5 ms",
            match bound {
                Some(bound) => format!(
                    "{} vs {} (half the floor's p50 {} + the round trip p50 {} + 0.5 ms)",
                    duration(self.p50),
                    duration(Some(bound)),
                    duration(floor_p50.map(|f| f / 2)),
                    duration(rtt_p50),
                ),
                None => format!("{}; no round trip to compare", duration(self.p50)),
            },
            bound.map(|bound| ms(self.p50) <= ms(Some(bound))),
        ));
        out
    }
}

/// The summary section: what the limit is, the chart (`chart` is its link
/// from the document, if one was written) and one table row per backend.
pub(crate) fn render(md: &mut String, all: &[OneWrite], chart: Option<&str>) {
    let Some(first) = all.first() else {
        return;
    };
    let n = first.contenders;
    let _ = writeln!(
        md,
        "\n### Contended hand-off against the one-write limit\n\n\
         A hand-off needs at least one durable write (the next holder's grant, which can carry \
         the release); the floor's cycle makes two, so one durable write per hand-off is 2 x the \
         floor's cycles/s, measured in the same run. Target: {n}-way contended grants/s through \
         `Locker` ≥ {TARGET:.1}x that limit.\n"
    );
    if let Some(chart) = chart {
        let _ = writeln!(
            md,
            "![Contended grants/s as a share of one durable write per hand-off]({chart})\n\n\
             *Contended grants/s per store as a share of its one-write limit: distlock's `Locker`, \
             the trait and each peer; solid line the limit (1.0x), dashed line the target \
             ({TARGET:.1}x); a bar past the limit makes less than one durable write per grant.*\n"
        );
    }
    let _ = writeln!(
        md,
        "| backend | Locker {n}-way grants/s | one-write limit/s | share | hand-off p50 | p99 | peers contended |\n\
         |---|--:|--:|--:|--:|--:|---|"
    );
    for w in all {
        let (rate, share) = w.locker().map_or(("-".into(), "-".into()), |l| {
            (thousands(l.per_sec), format!("{:.2}x", w.share(l.per_sec)))
        });
        let peers: Vec<String> = w
            .bars
            .iter()
            .filter(|b| b.kind == Kind::Peer)
            .map(|p| {
                format!(
                    "{}: {}/s ({:.2}x)",
                    p.label,
                    thousands(p.per_sec),
                    w.share(p.per_sec)
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {rate} | {} | {share} | {} | {} | {} |",
            w.backend,
            thousands(w.limit()),
            duration(w.p50),
            duration(w.p99),
            if peers.is_empty() {
                "none measured".into()
            } else {
                peers.join("; ")
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis() -> OneWrite {
        OneWrite {
            backend: "redis".into(),
            contenders: 16,
            floor_per_sec: 2_000.0,
            bars: vec![
                Bar {
                    kind: Kind::Locker,
                    label: "acquire".into(),
                    per_sec: 3_400.0,
                },
                Bar {
                    kind: Kind::Trait,
                    label: "acquire".into(),
                    per_sec: 3_000.0,
                },
                Bar {
                    kind: Kind::Peer,
                    label: "rslock".into(),
                    per_sec: 1_000.0,
                },
            ],
            p50: Some(Duration::from_micros(700)),
            p99: Some(Duration::from_millis(2)),
        }
    }

    #[test]
    fn the_summary_embeds_the_chart_and_sets_each_rate_against_the_limit() {
        let mut md = String::new();
        render(&mut md, &[redis()], Some("contended.svg"));
        assert!(md.contains("](contended.svg)"), "{md}");
        assert!(
            md.contains(
                "| redis | 3,400 | 4,000 | 0.85x | 0.700 ms | 2.000 ms | rslock: 1,000/s (0.25x) |"
            ),
            "{md}"
        );
        let mut none = String::new();
        render(&mut none, &[], Some("contended.svg"));
        assert!(none.is_empty(), "{none}");
    }

    #[test]
    fn the_targets_are_judged_against_the_limit_and_the_bound() {
        // One write = half the floor's p50 (0.4 ms); round trip 0.1 ms:
        // bound 1.0 ms, and the hand-off p50 is 0.7 ms.
        let v = redis().verdicts(
            Some(Duration::from_micros(800)),
            Some(Duration::from_micros(100)),
        );
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].met, Some(true), "{v:?}");
        assert!(
            v[0].measured.starts_with("0.85x: 3,400/s vs 4,000/s"),
            "{v:?}"
        );
        assert_eq!(v[1].met, Some(true), "{v:?}");
        let no_rtt = redis().verdicts(Some(Duration::from_micros(800)), None);
        assert_eq!(no_rtt[1].met, None, "{no_rtt:?}");
    }
}
