//! Semaphores: at most N permits at once, per-slot fences that strictly
//! increase, abandoned permits that expire, cancelled waits that leave
//! nothing, and one agreed number of permits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{FencingToken, LockError};
use rand::Rng;
use tokio::time::Instant;

use crate::{CaseResult, Ctx, Failure, Outcome, ensure, skip};

/// One permit grant, as its client saw it.
#[derive(Debug, Clone)]
struct PermitGrant {
    client: usize,
    slot: Option<u32>,
    fence: FencingToken,
    /// When the grant arrived.
    granted: Instant,
    /// When the client stopped counting on it (release sent).
    ended: Instant,
}

/// Seven clients take and release permits of a 3-permit semaphore at random
/// (waiting or trying once, holding 0-20 ms): no more than 3 holders at any
/// instant, every slot below 3, no slot held twice at once, and each slot's
/// fences strictly increasing in grant order.
pub async fn permits_never_exceed_n(cx: &Ctx) -> CaseResult {
    const PERMITS: u32 = 3;
    const CLIENTS: usize = 7;
    const ROUNDS: usize = 10;
    if !cx.caps().semaphores {
        skip!("the backend declares no semaphores");
    }
    let name = cx.name("permits");
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let permits = cx
            .locker(&cx.client().await?, cx.long_ttl())
            .semaphore(&name, PERMITS)?;
        let (history, hold) = (history.clone(), cx.scaled(Duration::from_millis(20)));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let (try_once, pause) = {
                    let mut rng = rand::rng();
                    (rng.random_bool(0.3), hold.mul_f64(rng.random()))
                };
                let guard = if try_once {
                    match permits.try_acquire().await? {
                        Some(guard) => guard,
                        None => continue,
                    }
                } else {
                    permits.acquire().await?
                };
                let granted = Instant::now();
                tokio::time::sleep(pause).await;
                let ended = Instant::now().min(guard.lease().deadline());
                history.lock().unwrap().push(PermitGrant {
                    client,
                    slot: guard.slot(),
                    fence: guard.fencing_token(),
                    granted,
                    ended,
                });
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(format!("client task failed: {e}")))??;
    }
    let grants = history.lock().unwrap().clone();
    ensure!(
        grants.len() >= CLIENTS,
        "only {} grants in the whole workload",
        grants.len()
    );
    let violations = check_permits(&grants, PERMITS);
    ensure!(
        violations.is_empty(),
        "{} permit history violations, the first ones:\n{}",
        violations.len(),
        violations[..violations.len().min(10)].join("\n")
    );
    Ok(Outcome::Passed)
}

/// The checkers of the permit history: slots in range, at most `permits`
/// holders at any instant, per slot no overlap and fences strictly
/// increasing in grant order.
fn check_permits(grants: &[PermitGrant], permits: u32) -> Vec<String> {
    let mut found = Vec::new();
    // Sweep: at equal instants an end comes before a start.
    let mut events: Vec<(Instant, i32)> = grants
        .iter()
        .flat_map(|g| [(g.granted, 1), (g.ended, -1)])
        .collect();
    events.sort();
    let (mut holding, mut most) = (0, 0);
    for (_, step) in events {
        holding += step;
        most = most.max(holding);
    }
    if most > permits as i32 {
        found.push(format!(
            "{most} clients counted on a permit at once, the semaphore has {permits}"
        ));
    }
    for g in grants {
        if g.slot.is_none_or(|s| s >= permits) {
            found.push(format!(
                "client {} was granted slot {:?} of a {permits}-permit semaphore",
                g.client, g.slot
            ));
        }
    }
    for slot in 0..permits {
        let mut held: Vec<&PermitGrant> = grants.iter().filter(|g| g.slot == Some(slot)).collect();
        held.sort_by_key(|g| g.granted);
        for pair in held.windows(2) {
            let (x, y) = (pair[0], pair[1]);
            if y.granted < x.ended {
                found.push(format!(
                    "slot {slot}: client {} (fence {}) was granted it while client {} (fence {}) held it",
                    y.client, y.fence, x.client, x.fence
                ));
            }
            if y.fence <= x.fence {
                found.push(format!(
                    "slot {slot}: fence {} (client {}) granted after fence {} (client {})",
                    y.fence, y.client, x.fence, x.client
                ));
            }
        }
    }
    found
}

/// A permit wait that is dropped returns at once and leaves nothing: once
/// every permit is released, N newcomers all get one straight away.
pub async fn cancelled_permit_wait_leaves_nothing(cx: &Ctx) -> CaseResult {
    const PERMITS: u32 = 2;
    if !cx.caps().semaphores {
        skip!("the backend declares no semaphores");
    }
    let name = cx.name("cancelled-permits");
    let mut semaphores = Vec::new();
    for _ in 0..5 {
        let locker = cx.locker(&cx.client().await?, cx.long_ttl());
        semaphores.push(locker.semaphore(&name, PERMITS)?);
    }
    let mut held = Vec::new();
    for permits in &semaphores[..2] {
        held.push(
            permits
                .try_acquire()
                .await?
                .ok_or_else(|| Failure::new("a free permit was refused"))?,
        );
    }
    let dropped = tokio::time::timeout(
        cx.scaled(Duration::from_millis(300)),
        semaphores[2].acquire(),
    )
    .await;
    ensure!(
        dropped.is_err(),
        "the permit wait should still have been waiting: {dropped:?}"
    );
    for guard in held {
        guard.release().await?;
    }
    // Give anything the dropped wait left behind the time to take a permit.
    tokio::time::sleep(cx.scaled(Duration::from_millis(300))).await;
    let leftover = semaphores[3].holders().await?;
    ensure!(
        leftover.is_empty(),
        "every permit was released and the only other wait was dropped, yet permits are taken: {leftover:?}"
    );
    let mut newcomers = Vec::new();
    for permits in &semaphores[3..] {
        newcomers.push(permits.try_acquire().await?.ok_or_else(|| {
            Failure::new(format!("{PERMITS} newcomers could not all get a permit"))
        })?);
    }
    for guard in newcomers {
        guard.release().await?;
    }
    Ok(Outcome::Passed)
}

/// While permits are held, a request with another number of permits (more or
/// fewer) fails with `PermitsMismatch` at once, waiting or not, instead of
/// over- or under-granting; a request that agrees still gets a permit.
pub async fn permit_count_disagreement_is_refused(cx: &Ctx) -> CaseResult {
    if !cx.caps().semaphores {
        skip!("the backend declares no semaphores");
    }
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("disagreeing");
    let first = cx.locker(&a, cx.long_ttl()).semaphore(&name, 2)?;
    let held = first
        .try_acquire()
        .await?
        .ok_or_else(|| Failure::new("a permit of a new semaphore was refused"))?;
    let other = cx.locker(&b, cx.long_ttl());
    for asked in [3, 1] {
        let permits = other.semaphore(&name, asked)?;
        let tried = permits.try_acquire().await;
        ensure!(
            matches!(tried, Err(LockError::PermitsMismatch { requested, existing: 2, .. }) if requested == asked),
            "a {asked}-permit request on a held 2-permit semaphore got {tried:?}"
        );
        let started = Instant::now();
        let waited = permits
            .acquire_timeout(cx.scaled(Duration::from_secs(5)))
            .await;
        ensure!(
            matches!(waited, Err(LockError::PermitsMismatch { .. })),
            "a {asked}-permit wait on a held 2-permit semaphore got {waited:?}"
        );
        // At once: one attempt, a call or two to the store (the wait would
        // have lasted 5 s).
        ensure!(
            started.elapsed() <= cx.round_trip() * 2,
            "a mismatched wait took {:?} to fail",
            started.elapsed()
        );
    }
    let second = other
        .semaphore(&name, 2)?
        .try_acquire()
        .await?
        .ok_or_else(|| Failure::new("the second of two permits was refused"))?;
    ensure!(held.slot() != second.slot(), "two holders share a slot");
    second.release().await?;
    held.release().await?;
    Ok(Outcome::Passed)
}

/// A semaphore of zero permits is bad input: refused with a typed error
/// before anything is taken, through a `Locker` and through the backend
/// alike (never an attempt that reads as "held").
pub async fn zero_permits_are_refused(cx: &Ctx) -> CaseResult {
    if !cx.caps().semaphores {
        skip!("the backend declares no semaphores");
    }
    let a = cx.client().await?;
    let name = cx.name("zero-permits");
    let via_locker = cx.locker(&a, cx.long_ttl()).semaphore(&name, 0);
    ensure!(
        matches!(via_locker, Err(LockError::InvalidConfig { .. })),
        "Locker::semaphore with 0 permits should be InvalidConfig, got {via_locker:?}"
    );
    let request = LockRequest::new(name.clone(), cx.caps().effective_ttl(cx.long_ttl())?);
    let direct = a.try_acquire_permit(&request, 0).await;
    ensure!(
        matches!(direct, Err(LockError::InvalidConfig { .. })),
        "a permit of a 0-permit semaphore should be InvalidConfig, got {direct:?}"
    );
    ensure!(
        a.inspect_permits(&name).await?.is_empty(),
        "a refused semaphore must not take a slot"
    );
    Ok(Outcome::Passed)
}
