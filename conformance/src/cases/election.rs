//! Elections: one leader at a time with strictly increasing terms, observers
//! that see every change, and a dead leader replaced after its lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::CancellationToken;
use lockcore::{FencingToken, HolderLabel, Leader, Leadership, ReleaseOutcome};
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// Three candidates each campaign three times, lead 20 ms and resign: a
/// sampler reading every candidate's `is_leader()` at once never sees two
/// leaders, nobody wins while another still leads, and terms strictly
/// increase from one leader to the next.
pub async fn one_leader_at_a_time(cx: &Ctx) -> CaseResult {
    const CANDIDATES: usize = 3;
    const TERMS_EACH: usize = 3;
    let name = cx.name("election");
    let seats: Arc<Mutex<Vec<Option<Leadership>>>> =
        Arc::new(Mutex::new((0..CANDIDATES).map(|_| None).collect()));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let violations = Arc::new(Mutex::new(Vec::new()));
    let done = CancellationToken::new();
    let sampler = tokio::spawn({
        let (seats, violations, done) = (seats.clone(), violations.clone(), done.clone());
        async move {
            while !done.is_cancelled() {
                let leading: Vec<FencingToken> = seats
                    .lock()
                    .unwrap()
                    .iter()
                    .flatten()
                    .filter(|l| l.is_leader())
                    .map(Leadership::term)
                    .collect();
                if leading.len() > 1 {
                    violations.lock().unwrap().push(format!(
                        "sampled {} leaders at once: terms {leading:?}",
                        leading.len()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    let (hold, patience) = (
        cx.scaled(Duration::from_millis(20)),
        cx.scaled(Duration::from_secs(10)),
    );
    let mut candidates = Vec::new();
    for me in 0..CANDIDATES {
        let election = cx
            .locker(&cx.client().await?, cx.long_ttl())
            .election(&name)?;
        let label = HolderLabel::new(format!("candidate {me}"))?;
        let (seats, terms, violations) = (seats.clone(), terms.clone(), violations.clone());
        candidates.push(tokio::spawn(async move {
            for _ in 0..TERMS_EACH {
                let leadership = tokio::time::timeout(patience, election.campaign(label.clone()))
                    .await
                    .map_err(|_| Failure::new(format!("candidate {me} was not elected within {patience:?}")))??;
                {
                    let mut seats = seats.lock().unwrap();
                    for (other, seat) in seats.iter().enumerate() {
                        if let Some(l) = seat.as_ref().filter(|l| l.is_leader()) {
                            violations.lock().unwrap().push(format!(
                                "candidate {me} won (term {}) while candidate {other} led (term {})",
                                leadership.term(),
                                l.term()
                            ));
                        }
                    }
                    terms.lock().unwrap().push((me, leadership.term()));
                    seats[me] = Some(leadership);
                }
                tokio::time::sleep(hold).await;
                let leadership = seats.lock().unwrap()[me].take().expect("seated above");
                leadership.resign().await?;
            }
            Ok::<_, Failure>(())
        }));
    }
    let mut outcome = Ok(());
    for candidate in candidates {
        let result = candidate
            .await
            .map_err(|e| Failure::new(format!("candidate task failed: {e}")))
            .and_then(|r| r);
        outcome = outcome.and(result);
    }
    done.cancel();
    let _ = sampler.await;
    outcome?;
    let violations = violations.lock().unwrap().clone();
    ensure!(
        violations.is_empty(),
        "two leaders at once ({} times), the first:\n{}",
        violations.len(),
        violations[..violations.len().min(10)].join("\n")
    );
    let terms = terms.lock().unwrap().clone();
    ensure!(
        terms.len() == CANDIDATES * TERMS_EACH,
        "{} terms for {} campaigns",
        terms.len(),
        CANDIDATES * TERMS_EACH
    );
    ensure!(
        terms.windows(2).all(|w| w[0].1 < w[1].1),
        "terms must strictly increase from leader to leader: {terms:?}"
    );
    Ok(Outcome::Passed)
}

/// An observer (`Election::observe`, re-checking every round trip) reports
/// each of three successive leaders, with its term and label, within its
/// re-check interval plus two round trips of the election and the suite's
/// scheduling cushion (1 s, scaled, as in [`Ctx::slack`]: a loaded machine
/// stretches a re-check's query far past the round trip measured at the
/// start), terms increasing, none skipped, and no leader once the last one
/// resigned. An observer that does not re-check reports nothing sooner
/// than the long TTL.
pub async fn observers_see_every_change(cx: &Ctx) -> CaseResult {
    const LEADERS: usize = 3;
    let name = cx.name("observed");
    let recheck = cx.round_trip();
    let bound = recheck + cx.round_trip() * 2 + cx.scaled(Duration::from_secs(1));
    let watcher = cx
        .locker(&cx.client().await?, cx.long_ttl())
        .recheck(recheck)
        .election(&name)?;
    let (tx, mut seen) = tokio::sync::watch::channel(Vec::<Result<Option<Leader>, String>>::new());
    let mut observer = watcher.observe();
    let follower = tokio::spawn(async move {
        while let Some(change) = observer.next().await {
            tx.send_modify(|seen| seen.push(change.map_err(|e| e.to_string())));
        }
    });
    let mut leaders = Vec::new();
    let mut outcome = Ok(());
    for i in 0..LEADERS {
        let label = HolderLabel::new(format!("leader {i}"))?;
        let election = cx
            .locker(&cx.client().await?, cx.long_ttl())
            .election(&name)?;
        let leadership =
            tokio::time::timeout(cx.slack(Duration::ZERO), election.campaign(label.clone()))
                .await
                .map_err(|_| Failure::new("a free election was not won within the slack"))??;
        let term = leadership.term();
        leaders.push((term, label.clone()));
        // Only a yes or no: a borrow of `seen` must not be held across an await.
        let reported = tokio::time::timeout(
            bound,
            seen.wait_for(|seen| {
                seen.iter()
                    .any(|s| matches!(s, Ok(Some(l)) if l.term == term))
            }),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        leadership.resign().await?;
        if !reported {
            outcome = Err(format!(
                "the observer did not report leader {i} (term {term}) within {bound:?}"
            ));
            break;
        }
    }
    if outcome.is_ok()
        && tokio::time::timeout(
            bound,
            seen.wait_for(|seen| matches!(seen.last(), Some(Ok(None)))),
        )
        .await
        .is_err()
    {
        outcome = Err(format!(
            "the observer did not report the vacancy within {bound:?}"
        ));
    }
    follower.abort();
    let seen = seen.borrow().clone();
    outcome.map_err(|why| Failure::new(format!("{why}; it saw {seen:?}")))?;
    let reported: Vec<Leader> = seen
        .iter()
        .map(|s| {
            s.clone()
                .map_err(|e| Failure::new(format!("the observer failed: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    let terms: Vec<FencingToken> = reported.iter().map(|l| l.term).collect();
    let expected: Vec<FencingToken> = leaders.iter().map(|(t, _)| *t).collect();
    ensure!(
        terms == expected,
        "the observer reported terms {terms:?}, the leaders' terms were {expected:?} (each once, in order)"
    );
    let labels: Vec<Option<&HolderLabel>> = reported.iter().map(|l| l.label.as_ref()).collect();
    let campaigned: Vec<Option<&HolderLabel>> = leaders.iter().map(|(_, l)| Some(l)).collect();
    ensure!(
        labels == campaigned,
        "the observer reported labels {labels:?}, the leaders campaigned with {campaigned:?}"
    );
    Ok(Outcome::Passed)
}

/// A leader that dies (its lease never renewed) is replaced by a waiting
/// candidate within TTL + slack, never before the dead leader's local
/// deadline, with a larger term; the dead leader's late resignation changes
/// nothing.
pub async fn dead_leader_is_replaced(cx: &Ctx) -> CaseResult {
    if !cx.per_lock_leases() {
        skip!("session leases expire with the session, not per lock (covered by the fault cases)");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("dead-leader");
    let ttl = cx.short_ttl();
    let started = Instant::now();
    let dead = cx
        .locker(&a, ttl)
        .auto_renew(false)
        .election(&name)?
        .campaign(HolderLabel::new("dead leader")?)
        .await?;
    let heir = cx.locker(&b, cx.long_ttl()).election(&name)?;
    let next = tokio::time::timeout_at(
        started + ttl + cx.slack(ttl),
        heir.campaign(HolderLabel::new("heir")?),
    )
    .await
    .map_err(|_| {
        Failure::new(format!(
            "no new leader within TTL {ttl:?} + slack {:?} of the dead leader's election",
            cx.slack(ttl)
        ))
    })??;
    ensure!(
        Instant::now() >= dead.guard().lease().deadline(),
        "a new leader was elected before the dead leader's local deadline"
    );
    ensure!(!dead.is_leader(), "the dead leader still thinks it leads");
    ensure!(
        next.term() > dead.term(),
        "term {} after term {}",
        next.term(),
        dead.term()
    );
    let dead_term = dead.term();
    let resigned = dead.resign().await?;
    ensure!(
        resigned == ReleaseOutcome::NotHeld,
        "the dead leader's late resignation reported {resigned:?}"
    );
    let leader = heir.leader().await?.map(|l| l.term);
    ensure!(
        leader == Some(next.term()),
        "after the dead leader (term {dead_term}) resigned late, the leader is {leader:?}, expected term {}",
        next.term()
    );
    next.resign().await?;
    Ok(Outcome::Passed)
}
