//! The random part of `rw_readers_share_writers_exclude`: seven clients
//! reading and writing at random, some crashing, and the checker of their
//! history.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::{Access, Attempt, FencingToken, LockError};
use rand::Rng;
use tokio::time::Instant;

use super::request;
use crate::{CaseResult, Ctx, Failure, Outcome, ensure};

/// One grant of the history, as its client saw it.
#[derive(Debug, Clone)]
struct Grant {
    client: usize,
    access: Access,
    fence: FencingToken,
    /// When the grant arrived.
    granted: Instant,
    /// When the client stopped counting on it: its release was sent, or
    /// its lease's local deadline (a crashed holder).
    ended: Instant,
}

/// Seven clients read (mostly) and write at random, some crashing (a share
/// taken once and never renewed, on stores with per-lock leases), then the
/// history is checked.
pub(super) async fn random_workload(cx: &Ctx) -> CaseResult {
    const CLIENTS: usize = 7;
    const ROUNDS: usize = 10;
    let name = cx.name("rw-random");
    let crashes = cx.per_lock_leases();
    let short = cx.short_ttl();
    let history = Arc::new(Mutex::new(Vec::new()));
    let hold = cx.scaled(Duration::from_millis(15));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let backend = cx.client().await?;
        let lock = cx.locker(&backend, cx.long_ttl()).rw_lock(&name)?;
        let crash_request = |access| request(cx, &name, short, access);
        let (read_crash, write_crash) =
            (crash_request(Access::Read)?, crash_request(Access::Write)?);
        let history = history.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let (access, crash, pause) = {
                    let mut rng = rand::rng();
                    let access = if rng.random_bool(0.7) {
                        Access::Read
                    } else {
                        Access::Write
                    };
                    (
                        access,
                        crashes && rng.random_bool(0.1),
                        hold.mul_f64(rng.random()),
                    )
                };
                if crash {
                    let asked = match access {
                        Access::Read => &read_crash,
                        Access::Write => &write_crash,
                    };
                    if let Attempt::Acquired(lease) = backend.try_acquire(asked).await? {
                        history
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(Grant {
                                client,
                                access,
                                fence: lease.fence(),
                                granted: Instant::now(),
                                ended: lease.deadline(),
                            });
                    }
                    continue;
                }
                let guard = match access {
                    Access::Read => lock.read().await?,
                    Access::Write => lock.write().await?,
                };
                let granted = Instant::now();
                tokio::time::sleep(pause).await;
                let ended = Instant::now().min(guard.lease().deadline());
                history
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Grant {
                        client,
                        access,
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
    let grants = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let writes = grants.iter().filter(|g| g.access == Access::Write).count();
    ensure!(
        writes > 0 && grants.len() > writes,
        "the workload saw {writes} writes among {} grants: too few to judge",
        grants.len()
    );
    let violations = check_history(&grants);
    ensure!(
        violations.is_empty(),
        "{} reader-writer history violations, the first ones:\n{}",
        violations.len(),
        violations[..violations.len().min(10)].join("\n")
    );
    Ok(Outcome::Passed)
}

/// No write overlaps another grant, and of a write and another grant one of
/// which ended before the other was granted, the earlier has the smaller
/// fence. (Two reads may overlap on the store whatever their clients saw,
/// so their order is not judged here.)
fn check_history(grants: &[Grant]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, g) in grants.iter().enumerate() {
        for h in &grants[i + 1..] {
            if g.access == Access::Read && h.access == Access::Read {
                continue;
            }
            if g.granted < h.ended && h.granted < g.ended {
                found.push(format!(
                    "client {} ({}, fence {}) and client {} ({}, fence {}) held at once",
                    g.client, g.access, g.fence, h.client, h.access, h.fence
                ));
            }
            let (before, after) = match (g.ended <= h.granted, h.ended <= g.granted) {
                (true, _) => (g, h),
                (_, true) => (h, g),
                _ => continue,
            };
            if before.fence >= after.fence {
                found.push(format!(
                    "a {} granted after a {} ended has fence {} after fence {}",
                    after.access, before.access, after.fence, before.fence
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(client: usize, access: Access, fence: u64, from_ms: u64, to_ms: u64) -> Grant {
        let t0 = Instant::now();
        Grant {
            client,
            access,
            fence: FencingToken::new(fence).unwrap(),
            granted: t0 + Duration::from_millis(from_ms),
            ended: t0 + Duration::from_millis(to_ms),
        }
    }

    #[test]
    fn the_history_check_finds_overlapping_writes_and_fences_out_of_order() {
        use Access::{Read, Write};
        let clean = [
            grant(0, Read, 1, 0, 10),
            grant(1, Read, 3, 5, 12),
            // Two reads may come back in any fence order.
            grant(2, Read, 2, 11, 14),
            grant(3, Write, 4, 15, 20),
            grant(0, Read, 5, 21, 30),
        ];
        assert!(
            check_history(&clean).is_empty(),
            "{:?}",
            check_history(&clean)
        );
        let overlap = [grant(0, Read, 1, 0, 10), grant(1, Write, 2, 5, 12)];
        assert!(check_history(&overlap)[0].contains("held at once"));
        let two_writers = [grant(0, Write, 1, 0, 10), grant(1, Write, 2, 9, 12)];
        assert!(check_history(&two_writers)[0].contains("held at once"));
        let backwards = [grant(0, Write, 5, 0, 10), grant(1, Read, 4, 11, 12)];
        assert!(check_history(&backwards)[0].contains("fence 4 after fence 5"));
    }
}
