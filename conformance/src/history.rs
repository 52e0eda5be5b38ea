//! A recorded history of grants, and the checkers run over it.
//!
//! Clients record each grant (when they asked, when they got it, and when
//! they stopped counting on it) and each fenced write. The checkers then look
//! for the violations Jepsen-style analyses look for: fences out of real-time
//! order (F1), two holders at once (S1), and valid writes refused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use lockcore::{FencingToken, LockName};
use tokio::time::Instant;

/// One grant, as the client saw it.
#[derive(Debug, Clone)]
pub struct Grant {
    /// Which client.
    pub client: usize,
    /// The lock.
    pub name: LockName,
    /// Its fencing token.
    pub fence: FencingToken,
    /// When the acquire was sent.
    pub invoked: Instant,
    /// When the grant arrived.
    pub granted: Instant,
    /// When the client stopped counting on it: release sent, or its local
    /// deadline when it let it lapse. `None` while still held.
    pub ended: Option<Instant>,
}

/// A thread-safe log of grants and violations.
#[derive(Debug, Default)]
pub struct History {
    grants: Mutex<Vec<Grant>>,
    violations: Mutex<Vec<String>>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a grant that arrived just now and returns its index, for
    /// [`end`](Self::end).
    pub fn granted(
        &self,
        client: usize,
        name: &LockName,
        fence: FencingToken,
        invoked: Instant,
    ) -> usize {
        self.granted_at(client, name, fence, invoked, Instant::now())
    }

    /// Records a grant whose reply arrived at `granted` (a task that noted
    /// the time) and returns its index.
    pub fn granted_at(
        &self,
        client: usize,
        name: &LockName,
        fence: FencingToken,
        invoked: Instant,
        granted: Instant,
    ) -> usize {
        let mut grants = self.grants.lock().unwrap();
        grants.push(Grant {
            client,
            name: name.clone(),
            fence,
            invoked,
            granted,
            ended: None,
        });
        grants.len() - 1
    }

    /// Records that the client stopped counting on grant `index` at `at`.
    pub fn end(&self, index: usize, at: Instant) {
        if let Some(grant) = self.grants.lock().unwrap().get_mut(index) {
            grant.ended = Some(grant.ended.map_or(at, |e| e.min(at)));
        }
    }

    /// Records that `client` stopped at `at`: it counts on none of its
    /// grants from then on. A client that stops drops its connection, and
    /// on a backend whose leases are its session's (ZooKeeper) that frees
    /// every lock it still held, abandoned ones included.
    pub fn client_stopped(&self, client: usize, at: Instant) {
        for grant in self.grants.lock().unwrap().iter_mut() {
            if grant.client == client {
                grant.ended = Some(grant.ended.map_or(at, |e| e.min(at)));
            }
        }
    }

    /// Sets how long the client counts on grant `index` (its latest local
    /// deadline); a later [`end`](Self::end) can only shorten it.
    pub fn counts_until(&self, index: usize, deadline: Instant) {
        if let Some(grant) = self.grants.lock().unwrap().get_mut(index) {
            grant.ended = Some(deadline);
        }
    }

    /// Records a violation seen while running (a valid write refused...).
    pub fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// The violations recorded while running (not the checkers').
    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }

    /// All grants so far.
    pub fn grants(&self) -> Vec<Grant> {
        self.grants.lock().unwrap().clone()
    }

    /// Runs every checker; returns the violations found (empty = clean).
    pub fn check(&self) -> Vec<String> {
        let grants = self.grants();
        let mut found = self.violations.lock().unwrap().clone();
        found.extend(check_fence_order(&grants));
        found.extend(check_no_overlap(&grants));
        found
    }
}

fn by_name(grants: &[Grant]) -> HashMap<&LockName, Vec<&Grant>> {
    let mut map: HashMap<&LockName, Vec<&Grant>> = HashMap::new();
    for g in grants {
        map.entry(&g.name).or_default().push(g);
    }
    map
}

/// F1: per name, tokens are unique, and a grant that completed before
/// another was asked for has the smaller token.
pub fn check_fence_order(grants: &[Grant]) -> Vec<String> {
    let mut found = Vec::new();
    for (name, gs) in by_name(grants) {
        for (i, x) in gs.iter().enumerate() {
            for y in &gs[i + 1..] {
                if x.fence == y.fence {
                    found.push(format!(
                        "F1: {name}: fence {} granted twice (clients {} and {})",
                        x.fence, x.client, y.client
                    ));
                }
                let (first, second) = if x.granted < y.invoked {
                    (x, y)
                } else if y.granted < x.invoked {
                    (y, x)
                } else {
                    continue;
                };
                if first.fence >= second.fence {
                    found.push(format!(
                        "F1: {name}: client {} got fence {} after client {} had got fence {}",
                        second.client, second.fence, first.client, first.fence
                    ));
                }
            }
        }
    }
    found
}

/// S1: per name, the intervals during which clients counted on a grant
/// (`granted..ended`) never intersect. A grant whose reply arrived after its
/// own deadline (a reply held up longer than the lease) was never counted
/// on: its interval is empty.
pub fn check_no_overlap(grants: &[Grant]) -> Vec<String> {
    overlaps(grants, Duration::ZERO)
}

/// S1 with an allowance: per name, no two grants counted on at once for
/// longer than `allowed` (after an asynchronous failover a second holder
/// may be granted while the first works, until the first's lease runs out).
pub fn check_overlap_at_most(grants: &[Grant], allowed: Duration) -> Vec<String> {
    overlaps(grants, allowed)
}

/// Every pair of one name's grants counted on at once for longer than
/// `allowed`.
fn overlaps(grants: &[Grant], allowed: Duration) -> Vec<String> {
    let now = Instant::now();
    let end = |g: &Grant| g.ended.unwrap_or(now);
    let mut found = Vec::new();
    for (name, mut gs) in by_name(grants) {
        gs.retain(|g| end(g) > g.granted);
        gs.sort_by_key(|g| g.granted);
        for (i, x) in gs.iter().enumerate() {
            let x_end = end(x);
            for y in &gs[i + 1..] {
                if y.granted >= x_end {
                    break;
                }
                if x_end.min(end(y)) - y.granted <= allowed {
                    continue;
                }
                found.push(format!(
                    "S1: {name}: client {} (fence {}) was granted {:?} before client {} (fence {}) \
                     stopped counting on its grant (counted on for {:?} and {:?}; asked {:?} apart)",
                    y.client,
                    y.fence,
                    x_end - y.granted,
                    x.client,
                    x.fence,
                    end(y) - y.granted,
                    x_end - x.granted,
                    y.invoked.max(x.invoked) - y.invoked.min(x.invoked),
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn grant(client: usize, fence: u64, at: Instant, from_ms: u64, to_ms: u64) -> Grant {
        Grant {
            client,
            name: LockName::new("n").unwrap(),
            fence: FencingToken::new(fence).unwrap(),
            invoked: at,
            granted: at + Duration::from_millis(from_ms),
            ended: Some(at + Duration::from_millis(to_ms)),
        }
    }

    #[test]
    fn overlapping_grants_are_reported() {
        let at = Instant::now();
        let found = check_no_overlap(&[grant(1, 1, at, 0, 100), grant(2, 2, at, 50, 150)]);
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn overlaps_within_the_allowance_pass_and_longer_ones_are_reported() {
        let at = Instant::now();
        let pair = [grant(1, 1, at, 0, 100), grant(2, 2, at, 50, 150)];
        assert!(check_overlap_at_most(&pair, Duration::from_millis(50)).is_empty());
        assert_eq!(
            check_overlap_at_most(&pair, Duration::from_millis(49)).len(),
            1
        );
        // The overlap ends with the earlier of the two ends.
        let inside = [grant(1, 1, at, 0, 300), grant(2, 2, at, 50, 80)];
        assert!(check_overlap_at_most(&inside, Duration::from_millis(30)).is_empty());
        assert_eq!(
            check_overlap_at_most(&inside, Duration::from_millis(29)).len(),
            1
        );
    }

    #[test]
    fn a_grant_that_arrived_past_its_deadline_overlaps_nothing() {
        let at = Instant::now();
        // Client 2's reply came 120 ms after its request, its lease ended at
        // 80 ms: it never counted on it.
        let found = check_no_overlap(&[grant(1, 2, at, 10, 200), grant(2, 1, at, 120, 80)]);
        assert!(found.is_empty(), "{found:?}");
    }

    /// A client that stops counts on none of its grants from then on, an
    /// abandoned one included; the other clients' grants keep their ends.
    #[test]
    fn a_stopped_client_counts_on_nothing_after_it_stopped() {
        let at = Instant::now();
        let history = History::new();
        let name = LockName::new("n").unwrap();
        let fence = |f| FencingToken::new(f).unwrap();
        let abandoned = history.granted_at(1, &name, fence(1), at, at);
        history.counts_until(abandoned, at + Duration::from_millis(300));
        let other = history.granted_at(2, &name, fence(2), at, at + Duration::from_millis(150));
        history.counts_until(other, at + Duration::from_millis(400));
        assert_eq!(check_no_overlap(&history.grants()).len(), 1);
        // Client 1 stops at 100 ms: its grant no longer overlaps client 2's.
        history.client_stopped(1, at + Duration::from_millis(100));
        let grants = history.grants();
        assert_eq!(grants[0].ended, Some(at + Duration::from_millis(100)));
        assert_eq!(grants[1].ended, Some(at + Duration::from_millis(400)));
        assert!(check_no_overlap(&grants[..2]).is_empty());
    }
}
