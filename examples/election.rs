//! Three candidates, a leader that freezes, and the term that fences it out.
//!
//! Run it with `cargo run --example election` (no server needed: it uses the
//! in-memory backend). `node-a` wins the election and writes the schedule
//! with its term. Then it freezes, like a process in a long GC pause or
//! stopped by `SIGSTOP`: `node-a` runs on its own thread and runtime, and
//! that thread blocks, so nothing of it runs, not even the task that renews
//! its lease. The store lets the lease run out, `node-b` or `node-c` wins
//! with a larger term and writes it to the schedule first thing. When
//! `node-a` wakes up it finishes the write it had started, under its old
//! term: the schedule refuses it. The new leader's writes go through, and
//! when it resigns the last candidate takes over with a larger term still.
//!
//! The program exits with an error unless all of that happened.

use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{
    Election, FencedResource, FencingToken, HolderLabel, Leader, Leadership, LockBackend,
    LockError, Locker, LossReason, MemoryBackend, Observer, StaleToken,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

/// The lease of every candidate: the longest a frozen leader goes unnoticed.
const TTL: Duration = Duration::from_millis(300);
/// The election's name.
const ELECTION: &str = "scheduler";

type BoxError = Box<dyn Error + Send + Sync>;

/// What the run showed; [`run`] returns it only if the story held.
#[derive(Debug)]
pub(crate) struct Story {
    /// The first leader's term.
    pub frozen_term: FencingToken,
    /// The leader that took over while the first one was frozen.
    pub successor: String,
    /// Its term.
    pub successor_term: FencingToken,
    /// The frozen leader's write after it woke up, refused.
    pub refusal: StaleToken,
    /// How the frozen leader's guard judged the leadership once it woke.
    pub frozen_loss: LossReason,
    /// The last candidate, leader after the successor resigned.
    pub last: String,
    /// Its term.
    pub last_term: FencingToken,
    /// The terms of the writes the schedule applied, in order.
    pub accepted: Vec<FencingToken>,
    /// Every line printed.
    pub narrative: Vec<String>,
}

/// Prints the story as it happens, and keeps it.
#[derive(Clone)]
struct Narrator {
    started: Instant,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Narrator {
    fn say(&self, who: &str, what: impl AsRef<str>) {
        let line = format!(
            "  +{:>5.3}s  {who:<9} {}",
            self.started.elapsed().as_secs_f64(),
            what.as_ref()
        );
        println!("{line}");
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The resource the leader owns: who scheduled what, fenced by term.
type Schedule = FencedResource<Vec<String>>;

/// What the frozen node reports to the rest of the cluster (the narrator
/// does its printing; the events let `run` wait for each step).
enum Frozen {
    Elected(FencingToken),
    Freezing,
    Woke {
        write: Result<(), StaleToken>,
        lost: LossReason,
    },
}

/// `node-a`: a whole process in one thread. Its locker (and so the task that
/// renews its lease) lives on this thread's runtime, so blocking the thread
/// stops all of it, as a pause of the process would.
fn node_a(
    store: MemoryBackend,
    schedule: Arc<Schedule>,
    say: Narrator,
    events: mpsc::UnboundedSender<Frozen>,
    go_on: tokio::sync::oneshot::Receiver<()>,
    resume: std::sync::mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<(), LockError>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for node-a");
        runtime.block_on(async move {
            let who = "node-a";
            let election = Locker::new(store).ttl(TTL).election(ELECTION)?;
            let leadership = election.campaign(HolderLabel::new(who)?).await?;
            let term = leadership.term();
            say.say(who, format!("campaigns and wins: term {term}"));
            let _ = events.send(Frozen::Elected(term));
            let first = write(&schedule, &leadership, "09:00 backups on node-3");
            say.say(
                who,
                format!("writes the schedule (term {term}): {}", outcome(&first)),
            );
            // Leads (and renews) while the others line up.
            let _ = go_on.await;

            // It checks that it still leads, starts its next write... and the
            // process freezes: this thread blocks until it is resumed, and
            // every task of node-a, its lease renewals included, stands still.
            assert!(leadership.is_leader());
            say.say(
                who,
                format!("is_leader() = true, starts a write... and FREEZES (lease TTL {TTL:?})"),
            );
            let _ = events.send(Frozen::Freezing);
            let frozen_at = std::time::Instant::now();
            let _ = resume.recv();
            let frozen_for = frozen_at.elapsed();

            let write = write(&schedule, &leadership, "09:00 backups on node-7");
            say.say(
                who,
                format!(
                    "wakes up {}ms later, completes its write under term {term}: {}",
                    frozen_for.as_millis(),
                    outcome(&write)
                ),
            );
            let lost = leadership.lost().await;
            say.say(
                who,
                format!(
                    "its guard reports the leadership lost ({lost}); is_leader() = {}",
                    leadership.is_leader()
                ),
            );
            let _ = events.send(Frozen::Woke { write, lost });
            Ok(())
        })
    })
}

/// A leader's write to the schedule, under its term.
fn write(schedule: &Schedule, leadership: &Leadership, entry: &str) -> Result<(), StaleToken> {
    let entry = format!(
        "{entry} (by {}, term {})",
        leadership.label(),
        leadership.term()
    );
    schedule.write(leadership.term(), |s| s.push(entry))
}

/// A candidate that campaigns until it leads, then hands its leadership over.
fn candidate(
    store: &MemoryBackend,
    label: &'static str,
    won: mpsc::UnboundedSender<Leadership>,
) -> Result<(), LockError> {
    let election: Election = Locker::new(store.clone()).ttl(TTL).election(ELECTION)?;
    let label = HolderLabel::new(label)?;
    tokio::spawn(async move {
        if let Ok(leadership) = election.campaign(label).await {
            let _ = won.send(leadership);
        }
    });
    Ok(())
}

/// The next leader the observer reports other than `previous` (printing
/// every change on the way, vacancies included).
async fn next_leader(
    observer: &mut Observer,
    previous: Option<FencingToken>,
    say: &Narrator,
) -> Result<Leader, BoxError> {
    loop {
        match observer.next().await {
            None => return Err("the observer stopped".into()),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(None)) => say.say("observer", "no leader"),
            Some(Ok(Some(leader))) => {
                let label = leader.label.as_ref().map_or("?", HolderLabel::as_str);
                say.say("observer", format!("leader: {label}, term {}", leader.term));
                if Some(leader.term) != previous {
                    return Ok(leader);
                }
            }
        }
    }
}

/// Waits at most `bound` for `step`, naming the step that did not happen.
async fn within<T>(
    bound: Duration,
    step: &str,
    fut: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    timeout(bound, fut)
        .await
        .map_err(|_| format!("{step}: not within {bound:?}"))?
}

/// The next message on a channel, as a step.
async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Result<T, BoxError> {
    rx.recv().await.ok_or_else(|| "the channel closed".into())
}

/// How a write went, for the narrative.
fn outcome(write: &Result<(), StaleToken>) -> String {
    match write {
        Ok(()) => "applied".into(),
        Err(stale) => format!("REFUSED: {stale}"),
    }
}

/// Runs the story and returns it, or an error saying what did not hold.
pub(crate) async fn run() -> Result<Story, BoxError> {
    let store = MemoryBackend::new();
    // A frozen leader's lease is gone after its TTL plus the store's expiry
    // slack; everything else here takes milliseconds. Waiting much longer
    // than that means the story is broken, not slow.
    let bound = TTL + store.capabilities().slack_for(TTL) + 5 * TTL;
    let say = Narrator {
        started: Instant::now(),
        lines: Arc::default(),
    };
    let schedule = Arc::new(Schedule::new(Vec::new()));
    println!("distlock election demo: 3 candidates for \"{ELECTION}\", lease TTL {TTL:?}\n");

    let mut observer = Locker::new(store.clone()).election(ELECTION)?.observe();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (go_on, go_on_rx) = tokio::sync::oneshot::channel();
    let (resume, resume_rx) = std::sync::mpsc::channel();
    let a = node_a(
        store.clone(),
        schedule.clone(),
        say.clone(),
        events_tx,
        go_on_rx,
        resume_rx,
    );

    let Frozen::Elected(frozen_term) = within(bound, "node-a leads", recv(&mut events)).await?
    else {
        return Err("node-a: expected its election first".into());
    };
    let seen = within(
        bound,
        "the observer sees node-a",
        next_leader(&mut observer, None, &say),
    )
    .await?;
    if seen.term != frozen_term {
        return Err(format!("the observer saw term {}, not {frozen_term}", seen.term).into());
    }

    // The other two campaign: they wait while node-a leads.
    let (won_tx, mut won) = mpsc::unbounded_channel();
    candidate(&store, "node-b", won_tx.clone())?;
    candidate(&store, "node-c", won_tx)?;
    say.say("node-b", "campaigns (waits)");
    say.say("node-c", "campaigns (waits)");
    let _ = go_on.send(());

    let Frozen::Freezing = within(bound, "node-a freezes", recv(&mut events)).await? else {
        return Err("node-a: expected it to freeze".into());
    };

    // Nobody tells the store node-a froze: its lease simply is not renewed.
    let new = within(
        bound,
        "a new leader after the freeze",
        next_leader(&mut observer, Some(frozen_term), &say),
    )
    .await?;
    let successor = within(bound, "the successor's campaign returns", recv(&mut won)).await?;
    let successor_term = successor.term();
    if new.term != successor_term || successor_term <= frozen_term {
        return Err(format!(
            "terms: frozen {frozen_term}, observed {}, successor {successor_term}",
            new.term
        )
        .into());
    }
    let successor_name = successor.label().to_string();
    // A new leader's first act: write its term to what it owns, so that any
    // older term is refused from now on.
    let took_over = write(&schedule, &successor, "takes over the schedule");
    say.say(
        &successor_name,
        format!(
            "wins with term {successor_term} > {frozen_term}, writes the schedule: {}",
            outcome(&took_over)
        ),
    );
    took_over?;

    // node-a resumes, as a stopped process would on SIGCONT.
    say.say("", "(node-a is resumed)");
    let _ = resume.send(());
    let Frozen::Woke {
        write: late,
        lost: frozen_loss,
    } = within(bound, "node-a wakes up", recv(&mut events)).await?
    else {
        return Err("node-a: expected it to wake up".into());
    };
    a.join().map_err(|_| "node-a panicked")??;
    let Err(refusal) = late else {
        return Err("node-a's late write was APPLIED: two leaders wrote".into());
    };

    let work = write(&schedule, &successor, "09:00 backups on node-5");
    say.say(
        &successor_name,
        format!(
            "writes the schedule (term {successor_term}): {}",
            outcome(&work)
        ),
    );
    work?;

    say.say(&successor_name, "resigns");
    successor.resign().await?;
    let next = within(
        bound,
        "the last candidate leads",
        next_leader(&mut observer, Some(successor_term), &say),
    )
    .await?;
    let last = within(bound, "the last campaign returns", recv(&mut won)).await?;
    let last_term = last.term();
    let last_name = last.label().to_string();
    let handover = write(&schedule, &last, "takes over the schedule");
    say.say(
        &last_name,
        format!(
            "wins with term {last_term}, writes the schedule: {}",
            outcome(&handover)
        ),
    );
    handover?;
    last.resign().await?;

    let story = Story {
        frozen_term,
        successor: successor_name,
        successor_term,
        refusal,
        frozen_loss,
        last: last_name,
        last_term,
        accepted: schedule.accepted(),
        narrative: Vec::new(),
    };
    let holds = story.refusal.token == frozen_term
        && story.refusal.highest == successor_term
        && next.term == last_term
        && last_term > successor_term
        && story.last != story.successor
        && story.accepted == [frozen_term, successor_term, successor_term, last_term]
        && schedule.rejected() == 1;
    println!("\n  the schedule:");
    for entry in schedule.read() {
        println!("    {entry}");
    }
    println!();
    if !holds {
        return Err(format!("VERDICT: the story did not hold: {story:?}").into());
    }
    println!(
        "VERDICT: safe. node-a was frozen past its lease while it believed it led; {} took over",
        story.successor
    );
    println!(
        "         with term {successor_term}, and node-a's late write under term {frozen_term} was refused."
    );
    Ok(Story {
        narrative: say.lines(),
        ..story
    })
}

#[tokio::main]
#[allow(dead_code)] // the test includes this file for `run`
async fn main() -> Result<(), BoxError> {
    let story = run().await?;
    println!(
        "terms: {} (frozen), {} ({}), {} ({}); refused: {}; {:?}; {} lines told",
        story.frozen_term,
        story.successor_term,
        story.successor,
        story.last_term,
        story.last,
        story.refusal,
        story.frozen_loss,
        story.narrative.len()
    );
    Ok(())
}
