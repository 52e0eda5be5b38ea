//! Lease deadlines on a 3-server ensemble whose followers can be cut off
//! from their leader.
//!
//! A follower cut off from the leader keeps answering reads and pings for
//! `syncLimit` ticks (2.5 s with the launcher), but the touches of its
//! clients' sessions no longer reach the leader, which expires those
//! sessions on its own clock. Whatever a client of that follower learns
//! from it, its lease's local deadline must come before the leader deletes
//! the lock node. These tests use a fixed 4 s session (not scaled): the
//! scenarios are timed against the ensemble's fixed `syncLimit`.

use std::collections::HashMap;
use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::{Cluster, zookeeper};
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig, zk};
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{LockBackend, ReleaseOutcome};
use rand::Rng;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::support::{children, raw, take, unique};
use crate::tap::Tap;

/// The session timeout of these tests.
const SESSION: Duration = Duration::from_secs(4);

/// One ensemble at a time: three JVMs each, on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// How many cut-off rounds a test runs (`LOCK_TEST_ZK_TRIALS`, default `default`).
fn trials(default: usize) -> usize {
    lock_conformance::kit::env::ZK_TRIALS.count(default)
}

/// A client of these tests: a 4 s session, the launcher's tick.
fn config(connect: &str) -> ZooKeeperConfig {
    crate::support::config(connect).session_timeout(SESSION)
}

/// An ensemble whose members reach each other's quorum port through fault
/// proxies, so a follower can be cut off from its leader.
struct Split {
    cluster: Cluster,
    links: HashMap<(usize, usize), FaultProxy>,
    leader: usize,
}

impl Split {
    /// Starts the ensemble behind its links; on a port another process
    /// took between its choice and the bind, again on other ports.
    async fn start() -> Split {
        let mut tries = 0;
        let (cluster, links) = loop {
            let mut plan = zookeeper::EnsemblePlan::new(3).unwrap();
            let mut links = HashMap::new();
            for from in 0..3 {
                for to in (0..3).filter(|&to| to != from) {
                    let link = FaultProxy::start(plan.quorum_addr(to)).await.unwrap();
                    plan.route(from, to, link.addr());
                    links.insert((from, to), link);
                }
            }
            match tokio::task::spawn_blocking(move || plan.start())
                .await
                .unwrap()
            {
                Ok(cluster) => break (cluster, links),
                Err(e) if lock_conformance::kit::port_clash(&e) && tries < 4 => tries += 1,
                Err(e) => panic!("{e}"),
            }
        };
        let leader = cluster.wait_leader(Duration::from_secs(30)).unwrap();
        Split {
            cluster,
            links,
            leader,
        }
    }

    fn follower(&self) -> usize {
        (self.leader + 1) % 3
    }

    fn url(&self, member: usize) -> String {
        self.cluster.members[member].endpoint()
    }

    /// Cuts `follower` off from the leader, both ways: its link to the
    /// leader's quorum port swallows everything.
    fn cut(&self, follower: usize) -> Instant {
        self.links[&(follower, self.leader)].set(Mode::Blackhole);
        Instant::now()
    }

    /// Heals the cut and waits until the ensemble has one leader and two
    /// followers again.
    async fn heal(&mut self, follower: usize) {
        let link = &self.links[&(follower, self.leader)];
        link.set(Mode::Pass);
        link.reset_existing();
        let addrs: Vec<_> = self.cluster.members.iter().map(|m| m.addr()).collect();
        self.leader = eventually(Duration::from_secs(60), "the ensemble re-forming", || {
            let addrs = addrs.clone();
            async move {
                let modes = tokio::task::spawn_blocking(move || {
                    addrs
                        .iter()
                        .map(|a| zookeeper::mode(*a).ok().flatten())
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap();
                let leaders: Vec<usize> = (0..3)
                    .filter(|&i| modes[i].as_deref() == Some("leader"))
                    .collect();
                let followers = modes
                    .iter()
                    .filter(|m| m.as_deref() == Some("follower"))
                    .count();
                (leaders.len() == 1 && followers == 2).then(|| leaders[0])
            }
        })
        .await;
    }
}

/// Signed seconds from `earlier` to `later`.
fn secs(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64()
    } else {
        -(earlier - later).as_secs_f64()
    }
}

/// The single lock node under `parent`, as the observer sees it, watched.
async fn watch_only_node(observer: &zk::Client, parent: &str) -> (String, zk::OneshotWatcher, i64) {
    let nodes = children(observer, parent).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let path = format!("{parent}/{}", nodes[0]);
    let (stat, watcher) = observer.check_and_watch_stat(&path).await.unwrap();
    (path, watcher, stat.expect("the lock node exists").czxid)
}

/// A holder on a follower renews (a `sync` through the leader, then a read),
/// and at once the follower is cut off from the leader. The leader last
/// heard of the session from the follower's report before the renewal: up
/// to one idle gap of the client plus half a tick earlier. The lease's
/// local deadline must still come before the leader deletes the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_on_a_cut_off_follower_ends_before_the_leader_expires_it() {
    if !crate::support::may_launch_servers("renewal_on_a_cut_off_follower") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut split = Split::start().await;
    let mut ahead = Vec::new();
    for trial in 0..trials(8) {
        let follower = split.follower();
        let observer = raw(&split.url(split.leader)).await;
        let holder = ZooKeeperBackend::connect_with(config(&split.url(follower)))
            .await
            .unwrap();
        let name = unique("cut-renew");
        let lease = take(&holder, &name).await;
        let (_, watcher, _) = watch_only_node(&observer, &holder.lock_path(&name)).await;
        // A random phase of the client's pings, then the renewal.
        let idle = SESSION.mul_f64(rand::rng().random_range(0.0..0.3));
        tokio::time::sleep(idle).await;
        let lease = holder.renew(&lease).await.unwrap();
        split.cut(follower);
        let event = tokio::time::timeout(SESSION * 3, watcher.changed())
            .await
            .expect("the leader expires the cut-off session");
        let gone = Instant::now();
        assert_eq!(event.event_type, zk::EventType::NodeDeleted);
        let lead = secs(gone, lease.deadline());
        eprintln!(
            "trial {trial}: renewed after {idle:?} idle; node deleted {lead:+.3} s after the local deadline"
        );
        ahead.push(lead);
        drop(holder);
        split.heal(follower).await;
    }
    let min = ahead.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ahead.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    eprintln!(
        "deletion minus local deadline over {} trials: min {min:+.3} s, max {max:+.3} s",
        ahead.len()
    );
    assert!(
        min > 0.0,
        "the leader deleted a renewed lock node {:.3} s before the lease's local deadline",
        -min
    );
}

/// When the waiter's replies are held back.
#[derive(Debug, Clone, Copy)]
enum Hold {
    /// After it queued and watched the node ahead (for longer than a
    /// quarter of the session): it learns of the deletion late, then reads
    /// the queue.
    WhileWatching,
    /// From before it queues: it learns late that it queued, then finds the
    /// node ahead already gone.
    WhileQueueing,
}

/// A waiter on a follower learns late (its replies held back) that the node
/// ahead of it was deleted, after the follower was cut off from the leader.
/// The follower still answers its reads; a grant based on them would start
/// the lease's clock at a time the leader never heard of the session. Any
/// lease the waiter gets must end on its local clock before the leader
/// deletes its node. Returns the seconds from the deadline to the deletion
/// of a node granted during the cut (`None`: granted only after healing).
async fn stale_read_trial(split: &mut Split, hold: Hold) -> Option<f64> {
    let follower = split.follower();
    let observer = raw(&split.url(split.leader)).await;
    let on_follower = raw(&split.url(follower)).await;
    let holder = ZooKeeperBackend::connect_with(config(&split.url(split.leader)))
        .await
        .unwrap();
    let name = unique("cut-wait");
    // Renewed until released: the waiter's scenario runs for more than the
    // local deadline of a lease left unrenewed, longer on a loaded machine.
    let held = (crate::support::locker(&holder)
        .try_acquire(&name)
        .await
        .unwrap())
    .expect("a fresh name is free");
    let parent = holder.lock_path(&name);
    let (head, _, _) = watch_only_node(&observer, &parent).await;
    let tap = Tap::start(split.cluster.members[follower].addr()).await;
    // Replies may be held for up to 3/5 of the session without the client
    // giving up the connection.
    let waiter = ZooKeeperBackend::connect_with(
        config(&tap.addr().to_string()).connection_timeout(SESSION * 3 / 5),
    )
    .await
    .unwrap();
    let policy =
        WaitPolicy::new(Instant::now() + Duration::from_secs(60)).recheck(Duration::from_secs(60));
    if let Hold::WhileQueueing = hold {
        tap.hold_replies(true);
    }
    let acquiring = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move { waiter.acquire_for(&name, SESSION, &policy).await }
    });
    let ours = eventually(Duration::from_secs(10), "the waiter queueing", || async {
        let nodes = children(&observer, &parent).await;
        let ours = nodes.into_iter().find(|n| !head.ends_with(n.as_str()))?;
        Some(format!("{parent}/{ours}"))
    })
    .await;
    let (stat, ours_gone) = observer.check_and_watch_stat(&ours).await.unwrap();
    let ours_czxid = stat.expect("the waiter's node").czxid;
    if let Hold::WhileWatching = hold {
        // Long enough that the waiter's last proof of contact with the
        // leader (its create) is too old for the fast path.
        tokio::time::sleep(SESSION / 4 + Duration::from_millis(200)).await;
        tap.hold_replies(true);
    }
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    until(
        Duration::from_secs(10),
        "the follower seeing the release",
        || async { on_follower.check_stat(&head).await.unwrap().is_none() },
    )
    .await;
    let cut = split.cut(follower);
    // Past the margin of a lease that started now, before the follower
    // gives up its leader (10 ticks) and before the waiter's connection
    // times out (3/5 of the session).
    tokio::time::sleep(Duration::from_millis(1900)).await;
    tap.hold_replies(false);
    // Keep the cut until the leader has surely expired every session it
    // last heard of before the cut.
    let mut acquiring = acquiring;
    let early = tokio::time::timeout_at(cut + SESSION * 3 / 2, &mut acquiring).await;
    let ours_deleted = tokio::time::timeout_at(cut + SESSION * 3 / 2, ours_gone.changed())
        .await
        .ok()
        .map(|_| Instant::now());
    split.heal(follower).await;
    let lease = match early {
        Ok(outcome) => outcome,
        Err(_) => tokio::time::timeout(Duration::from_secs(60), acquiring)
            .await
            .expect("the waiter is granted after healing"),
    }
    .unwrap()
    .unwrap()
    .expect("granted");
    if lease.fence().get() == ours_czxid as u64
        && let Some(deleted) = ours_deleted
    {
        return Some(secs(deleted, lease.deadline()));
    }
    // Granted after healing (a fresh session, or a read synced with the
    // leader): a lease like any other.
    assert!(lease.remaining() > Duration::ZERO);
    assert_eq!(
        waiter.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    None
}

async fn stale_read_trials(hold: Hold) {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut split = Split::start().await;
    let mut ahead = Vec::new();
    for trial in 0..trials(3) {
        let outcome = stale_read_trial(&mut split, hold).await;
        match outcome {
            Some(lead) => eprintln!(
                "trial {trial}: granted during the cut; node deleted {lead:+.3} s after the local deadline"
            ),
            None => eprintln!("trial {trial}: granted only once the follower rejoined"),
        }
        ahead.extend(outcome);
    }
    let early: Vec<f64> = ahead.into_iter().filter(|&lead| lead <= 0.0).collect();
    assert!(
        early.is_empty(),
        "{hold:?}: the leader deleted a granted node before the lease's local deadline by {early:.3?} s"
    );
}

/// A holder on a follower whose replies are lost (its requests still
/// arrive) keeps its session alive while it retries, for 7/5 of the timeout
/// after its last reply; the leader then expires the session within a
/// timeout and 1.5 ticks of the last request. Its lock is free within TTL +
/// the declared slack of the moment the replies stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_one_way_frees_its_lock_within_ttl_and_slack() {
    if !crate::support::may_launch_servers("a_holder_cut_off_one_way") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let split = Split::start().await;
    let observer = raw(&split.url(split.leader)).await;
    for trial in 0..trials(3) {
        let follower = split.follower();
        let link = FaultProxy::start(split.cluster.members[follower].addr())
            .await
            .unwrap();
        let holder = ZooKeeperBackend::connect_with(config(&link.addr().to_string()))
            .await
            .unwrap();
        let caps = holder.capabilities();
        let name = unique("one-way");
        let _lease = take(&holder, &name).await;
        let (_, watcher, _) = watch_only_node(&observer, &holder.lock_path(&name)).await;
        link.set(Mode::DropDownstream);
        let cut = Instant::now();
        let bound = SESSION + caps.expiry_slack;
        let event = tokio::time::timeout(bound * 2, watcher.changed())
            .await
            .expect("the leader expires the session");
        assert_eq!(event.event_type, zk::EventType::NodeDeleted);
        let freed = cut.elapsed();
        eprintln!(
            "trial {trial}: freed {freed:?} after the replies stopped (TTL + slack {bound:?})"
        );
        // The observer hears of the deletion within a few milliseconds.
        assert!(
            freed <= bound + Duration::from_millis(100).mul_f64(crate::support::time_scale()),
            "the lock outlived TTL + slack: {freed:?} > {bound:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_told_late_of_its_turn_by_a_cut_off_follower_is_not_granted_early() {
    if crate::support::may_launch_servers("waiter_told_late_of_its_turn") {
        stale_read_trials(Hold::WhileWatching).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_queued_late_on_a_cut_off_follower_is_not_granted_early() {
    if crate::support::may_launch_servers("waiter_queued_late") {
        stale_read_trials(Hold::WhileQueueing).await;
    }
}
