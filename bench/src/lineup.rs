//! The rows every backend gets, measured the same way: uncontended cycles
//! through the trait and through `Locker` next to the store's floor and the
//! peers (all taking turns in slices), a semaphore's permits through
//! `Locker`, then N-way contention the same way and leader hand-overs next
//! to it, and where each stands against its targets.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{Access, LockBackend};

use crate::Settings;
use crate::harness::{self, Ask, Multi, Op, Permits, Raw, Rw, Shared, Stats, User, cycle, ms};
use crate::limit::{self, Bar, OneWrite};
use crate::report::{Kind, Report, Row, Verdict, duration};

/// What one backend brings to the common measurements.
pub(crate) struct Lineup {
    /// The row label, e.g. "redis" or "redis, no persistence".
    pub backend: String,
    /// The store's own round trip, already measured, and what it was.
    pub round_trip: Option<(String, Stats)>,
    /// The store's two-round-trip floor with the same durability, and what it is.
    pub floor: Option<(String, Op)>,
    /// More floors, measured in the same turns (shown, not targeted).
    pub other_floors: Vec<(String, Op)>,
    /// Uncontended peer cycles (another library on the same store).
    pub peers: Vec<(String, Op)>,
    /// Contended peers: one client per contender each.
    pub contended_peers: Vec<(String, Vec<Shared>)>,
    /// The backend for the uncontended rows.
    pub backend_instance: Arc<dyn LockBackend>,
    /// One independent instance per contender (like N processes).
    pub contenders: Vec<Arc<dyn LockBackend>>,
    /// Uncontended `Locker` cycles must reach this share of the floor.
    pub floor_target: Option<f64>,
}

/// Permits of the semaphore in the permit rows.
const PERMITS: u32 = 4;

/// Names of the multi-lock in the multi-lock row.
const MULTI_NAMES: usize = 4;

/// Measures the lineup; rows and verdicts go into the report.
pub(crate) async fn measure(lineup: Lineup, settings: &Settings) -> Report {
    let mut report = Report::default();
    let b = lineup.backend.as_str();
    let ttl = settings.ttl;
    let name = format!("bench/{}", b.replace([' ', ','], "-"));
    let backend = lineup.backend_instance.clone();
    let notifies = backend.capabilities().notifications;
    let semaphores = backend.capabilities().semaphores;
    let rw_locks = backend.capabilities().rw_locks;
    let permits_label = format!("uncontended permit acquire + release ({PERMITS} permits)");
    let rw_name = format!("{name}-rw");

    let rtt_p50 = lineup.round_trip.as_ref().and_then(|(_, s)| s.p50());
    let rtt_label = lineup
        .round_trip
        .as_ref()
        .map_or(String::new(), |(l, _)| l.clone());
    if let Some((label, stats)) = &lineup.round_trip {
        report.row(Row::new(b, Kind::RoundTrip, label.clone(), stats));
    }
    // Uncontended: floors, trait, Locker (try / waiting), peers, in turns.
    let mut labels: Vec<(Kind, String)> = Vec::new();
    let mut ops: Vec<Op> = Vec::new();
    let has_floor = lineup.floor.is_some();
    for (label, op) in lineup.floor.into_iter().chain(lineup.other_floors) {
        labels.push((Kind::Floor, label));
        ops.push(op);
    }
    let first_own = ops.len();
    labels.push((Kind::Trait, "uncontended try_acquire + release".into()));
    ops.push(cycle(Raw::shared(backend.clone(), &name, ttl, Ask::Try)));
    labels.push((Kind::Locker, "uncontended try_acquire + release".into()));
    ops.push(cycle(User::shared(
        harness::locker(backend.clone(), ttl),
        &name,
        Ask::Try,
    )));
    labels.push((Kind::Locker, "uncontended acquire + release".into()));
    ops.push(cycle(User::shared(
        harness::locker(backend.clone(), ttl),
        &name,
        Ask::Wait,
    )));
    if semaphores {
        labels.push((Kind::Locker, permits_label.clone()));
        ops.push(cycle(Permits::shared(
            harness::locker(backend.clone(), ttl),
            &format!("{name}-permits"),
            PERMITS,
            Ask::Wait,
        )));
    }
    let multi_at = ops.len();
    labels.push((
        Kind::Locker,
        format!("uncontended acquire_all of {MULTI_NAMES} names + release"),
    ));
    let multi_names: Vec<String> = (0..MULTI_NAMES)
        .map(|i| format!("{name}-multi-{i}"))
        .collect();
    ops.push(cycle(Multi::shared(
        harness::locker(backend.clone(), ttl),
        &multi_names,
        Ask::Wait,
    )));
    // Against the Locker lock cycle: (index of the row, what it is).
    let mut vs_lock_cycle = vec![multi_at];
    let rw_labels = [Access::Read, Access::Write].map(|a| format!("uncontended {a} + release"));
    if rw_locks {
        for (access, label) in [Access::Read, Access::Write].into_iter().zip(&rw_labels) {
            vs_lock_cycle.push(ops.len());
            labels.push((Kind::Locker, label.clone()));
            ops.push(cycle(Rw::shared(
                harness::locker(backend.clone(), ttl),
                &rw_name,
                access,
            )));
        }
    }
    for (label, op) in lineup.peers {
        labels.push((Kind::Peer, format!("uncontended {label}")));
        ops.push(op);
    }
    let stats = harness::interleaved(&ops, settings).await;
    let floor = has_floor.then(|| stats[0].clone());
    for (i, ((kind, label), s)) in labels.iter().zip(&stats).enumerate() {
        let mut row = Row::new(b, *kind, label.clone(), s);
        if i > 0 && has_floor {
            let ratio = s.per_sec() / floor.as_ref().map_or(f64::NAN, Stats::per_sec);
            row = row.note(format!("{ratio:.2}x the floor"));
        } else if i == 0 && has_floor {
            row = row.note("interleaved with the rows below");
        }
        if (semaphores && i == first_own + 3) || vs_lock_cycle.contains(&i) {
            let ratio = s.per_sec() / stats[first_own + 2].per_sec();
            row = row.note(format!("{ratio:.2}x the Locker lock cycle"));
        }
        report.row(row);
        if !semaphores && i == first_own + 2 {
            report.row(
                Row::unsupported(b, Kind::Locker, permits_label.clone())
                    .note("the backend has no semaphores"),
            );
        }
        if !rw_locks && i == multi_at {
            for label in &rw_labels {
                report.row(
                    Row::unsupported(b, Kind::Locker, label.clone())
                        .note("the backend has no reader-writer locks"),
                );
            }
        }
    }
    let locker_wait = &stats[first_own + 2];
    let locker_try = &stats[first_own + 1];
    if let (Some(target), Some(floor)) = (lineup.floor_target, &floor) {
        let ratio = locker_wait.per_sec() / floor.per_sec();
        report.verdict(Verdict::new(
            b,
            format!("uncontended acquire+release through Locker ≥ {target:.2}x the floor"),
            format!(
                "{ratio:.2}x (acquire; try_acquire {:.2}x): {:.0}/s vs {:.0}/s",
                locker_try.per_sec() / floor.per_sec(),
                locker_wait.per_sec(),
                floor.per_sec()
            ),
            Some(ratio >= target),
        ));
    }

    // Contended: trait, Locker, peers, in turns.
    let n = lineup.contenders.len();
    let mut kinds: Vec<(Kind, String, Vec<Shared>)> = vec![
        (
            Kind::Trait,
            format!("{n}-way contended acquire"),
            lineup
                .contenders
                .iter()
                .map(|c| Raw::shared(c.clone(), &name, ttl, Ask::Wait))
                .collect(),
        ),
        (
            Kind::Locker,
            format!("{n}-way contended acquire"),
            lineup
                .contenders
                .iter()
                .map(|c| User::shared(harness::locker(c.clone(), ttl), &name, Ask::Wait))
                .collect(),
        ),
    ];
    // Writers hand the name to each other; readers share it.
    if rw_locks {
        for (access, what) in [(Access::Write, "writes"), (Access::Read, "reads")] {
            kinds.push((
                Kind::Locker,
                format!("{n}-way contended {what} of a reader-writer lock"),
                lineup
                    .contenders
                    .iter()
                    .map(|c| Rw::shared(harness::locker(c.clone(), ttl), &rw_name, access))
                    .collect(),
            ));
        }
    }
    let peers_at = kinds.len();
    for (label, clients) in lineup.contended_peers {
        kinds.push((Kind::Peer, format!("{n}-way contended {label}"), clients));
    }
    let clients: Vec<Vec<Shared>> = kinds.iter().map(|(_, _, c)| c.clone()).collect();
    let results = harness::contended_interleaved(&clients, settings).await;
    // Leader hand-overs between two of the contenders. The waiting candidate
    // gets a few lock cycles' time to be in line before the leader resigns.
    let settle = (locker_wait.percentile(0.99).unwrap_or_default() * 4)
        .clamp(Duration::from_millis(2), Duration::from_millis(200));
    let election = format!("{name}-leader");
    let candidates = [0, 1].map(|i| {
        harness::locker(lineup.contenders[i].clone(), ttl)
            .election(election.as_str())
            .expect("a valid election name")
    });
    let handovers = harness::leader_handovers(candidates, settle, settings.run).await;
    let vs_rtt = |p99| {
        if rtt_p50.is_some() {
            format!("p99 = {:.1}x the round trip p50", ms(p99) / ms(rtt_p50))
        } else {
            String::new()
        }
    };
    for (i, ((kind, label, _), c)) in kinds.iter().zip(&results).enumerate() {
        let row = Row::contended(b, *kind, label.clone(), c);
        let p99 = row.p99;
        let note = if (2..peers_at).contains(&i) {
            let ratio = c.per_sec() / results[1].per_sec();
            let to_floor = floor.as_ref().map_or(String::new(), |f| {
                format!("{:.2}x the floor", c.per_sec() / f.per_sec())
            });
            [
                format!("{ratio:.2}x the contended lock"),
                to_floor,
                vs_rtt(p99),
            ]
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
        } else {
            vs_rtt(p99)
        };
        let to_limit = floor
            .as_ref()
            .map_or(String::new(), |f| limit::note(c.per_sec(), f.per_sec()));
        report.row(row.note(to_limit).note(note));
        if i == 1 && !rw_locks {
            for what in ["writes", "reads"] {
                report.row(
                    Row::unsupported(
                        b,
                        Kind::Locker,
                        format!("{n}-way contended {what} of a reader-writer lock"),
                    )
                    .note("the backend has no reader-writer locks"),
                );
            }
        }
        if i == 1 {
            let mut row = Row::new(
                b,
                Kind::Locker,
                "leader hand-over (resign → campaign)",
                &handovers,
            );
            // Each hand-over waits for its candidate to be in line: no rate.
            row.per_sec = f64::NAN;
            let p50 = ms(row.p50) / ms(c.handoffs.p50());
            report.row(row.note(format!(
                "{} hand-overs, the candidate in line {} before; p50 = {p50:.1}x the lock hand-off p50",
                handovers.samples.len(),
                duration(Some(settle))
            )));
        }
    }
    let ours = &results[1];
    // Locker, the trait, the peers against the one-write limit: the summary
    // table, the chart and the targets.
    let one_write = floor.as_ref().map(|floor| OneWrite {
        backend: b.to_string(),
        contenders: n,
        floor_per_sec: floor.per_sec(),
        bars: [1, 0]
            .into_iter()
            .chain(peers_at..kinds.len())
            .map(|i| Bar {
                kind: kinds[i].0,
                label: kinds[i]
                    .1
                    .trim_start_matches(&format!("{n}-way contended "))
                    .to_string(),
                per_sec: results[i].per_sec(),
            })
            .collect(),
        p50: ours.handoffs.p50(),
        p99: ours.handoffs.percentile(0.99),
    });
    let best_peer = kinds
        .iter()
        .zip(&results)
        .skip(peers_at)
        .max_by(|a, b| a.1.per_sec().total_cmp(&b.1.per_sec()));
    match best_peer {
        Some(((_, label, _), peer)) => report.verdict(Verdict::new(
            b,
            format!("{n}-way contended acquisitions/s through Locker ≥ the best peer"),
            format!(
                "{:.0}/s vs {:.0}/s ({label}): {:.2}x; the peer gives no fencing token",
                ours.per_sec(),
                peer.per_sec(),
                ours.per_sec() / peer.per_sec().max(1e-9)
            ),
            Some(ours.per_sec() >= peer.per_sec()),
        )),
        None => report.verdict(Verdict::new(
            b,
            format!("{n}-way contended acquisitions/s through Locker ≥ the best peer"),
            format!("{:.0}/s; no peer on this store", ours.per_sec()),
            None,
        )),
    }
    let p99 = ours.handoffs.percentile(0.99);
    report.verdict(Verdict::new(
        b,
        "hand-off p99 through Locker ≤ 5x the store's round trip (where it notifies)",
        if rtt_p50.is_some() {
            format!(
                "{:.2} ms = {:.1}x {rtt_label} p50 ({:.3} ms); {:.1}x the floor's p50 (two writes as durable as a lock's){}",
                ms(p99),
                ms(p99) / ms(rtt_p50),
                ms(rtt_p50),
                ms(p99) / ms(floor.as_ref().and_then(Stats::p50)),
                if notifies {
                    ""
                } else {
                    "; this backend does not notify waiters"
                }
            )
        } else {
            format!("{:.2} ms; no round trip to compare", ms(p99))
        },
        (notifies && rtt_p50.is_some()).then(|| ms(p99) <= 5.0 * ms(rtt_p50)),
    ));
    if let Some(one_write) = one_write {
        for v in one_write.verdicts(floor.as_ref().and_then(Stats::p50), rtt_p50) {
            report.verdict(v);
        }
        report.limits.push(one_write);
    }
    report
}
