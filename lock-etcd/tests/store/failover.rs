//! A dead holder's lock across a leader loss and a restart: etcd 3.4
//! restarts every lease at its full TTL when a new leader takes over, so the
//! lock outlives its TTL by up to one more TTL and a few election timeouts.
//! The declared slack (`Capabilities::slack_for`, which grows with the TTL)
//! must cover that: a waiting contender is granted within TTL + the slack
//! for that TTL of the holder's last renewal (a restart's downtime excluded).
//!
//! `LOCK_TEST_ETCD_FAILOVER_RUNS` (default 3) sets the kills per test; each prints
//! min/median/max.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{name, scaled};
use lock_conformance::kit::stores::{Store, etcd};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Lease, LockBackend, LockName};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(1);

fn runs() -> usize {
    lock_conformance::kit::env::ETCD_FAILOVER_RUNS.count(3)
}

async fn connect(endpoints: &[String]) -> EtcdBackend {
    EtcdBackend::connect_with(
        EtcdConfig::new(endpoints.to_vec()).request_timeout(scaled(Duration::from_secs(1))),
    )
    .await
    .expect("connect")
}

/// The holder renews a few times, then dies (its client is dropped, nothing
/// released) right after a renewal, whose send time is returned.
async fn holder_dies(endpoints: &[String], name: &LockName) -> Instant {
    let holder = connect(endpoints).await;
    let mut lease = holder
        .try_acquire_for(name, TTL)
        .await
        .expect("try_acquire")
        .into_lease()
        .expect("a fresh name is free");
    let mut last = Instant::now();
    for _ in 0..3 {
        tokio::time::sleep(TTL / 3).await;
        last = Instant::now();
        lease = holder.renew(&lease).await.expect("renew");
    }
    last
}

/// A contender waiting in line (on every member), reporting when it was
/// granted.
fn contender(backend: EtcdBackend, name: &LockName) -> JoinHandle<(Lease, Instant)> {
    let name = name.clone();
    tokio::spawn(async move {
        let wait = WaitPolicy::new(Instant::now() + scaled(Duration::from_secs(60)))
            .recheck(scaled(Duration::from_millis(200)));
        let lease = backend
            .acquire_for(&name, TTL, &wait)
            .await
            .expect("acquire")
            .expect("granted before the deadline");
        (lease, Instant::now())
    })
}

/// When to kill, after the last renewal: spread from early in the lease to
/// just before etcd would have revoked it (TTL + one 500 ms sweep).
fn kill_offset(run: usize, runs: usize) -> Duration {
    let at = if runs == 1 {
        1.0
    } else {
        run as f64 / (runs - 1) as f64
    };
    TTL.mul_f64(0.1 + 1.3 * at)
}

fn summary(what: &str, mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "{what}: n={} min={:?} median={:?} max={:?}",
        times.len(),
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_lock_is_free_within_ttl_plus_slack_after_leader_loss() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| etcd::start_cluster(3))
            .await
            .unwrap()
            .expect("a 3-member etcd cluster"),
    );
    let endpoints = cluster.endpoints();
    let contender_client = connect(&endpoints).await;
    let slack = contender_client.capabilities().slack_for(TTL);
    // The contender's own reaction: a watch event, or its re-check when its
    // stream was on the killed member.
    let bound = TTL + slack + scaled(Duration::from_millis(500));
    let runs = runs();
    let mut blocked = Vec::new();
    for run in 0..runs {
        let lock = name("leader-loss");
        let last = holder_dies(&endpoints, &lock).await;
        let waiting = contender(contender_client.clone(), &lock);
        tokio::time::sleep_until(last + kill_offset(run, runs)).await;
        let killed_at = Instant::now();
        let killed = {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.kill_leader())
                .await
                .unwrap()
                .expect("kill -9 the leader")
        };
        let (lease, granted) = waiting.await.unwrap();
        eprintln!(
            "run {run}: leader killed {:?} after the last renewal, contender granted after {:?}",
            killed_at - last,
            granted - last
        );
        assert!(
            granted - last <= bound,
            "L1: granted {:?} after the dead holder's last renewal, beyond TTL + slack \
             ({TTL:?} + {slack:?}, + 500 ms to react)",
            granted - last
        );
        blocked.push(granted - last);
        let _ = contender_client.release(&lease).await;
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster.members[killed].restart_now()?;
            cluster.wait_leader(Duration::from_secs(20))
        })
        .await
        .unwrap()
        .expect("the killed member rejoins");
    }
    eprintln!(
        "{} (declared slack {slack:?})",
        summary("leader loss, grant after the last renewal", blocked)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_lock_is_free_within_ttl_plus_slack_after_a_restart() {
    let store: Arc<Store> = Arc::new(
        tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default()))
            .await
            .unwrap()
            .expect("a private etcd"),
    );
    let endpoints = vec![store.endpoint()];
    let contender_client = connect(&endpoints).await;
    let slack = contender_client.capabilities().slack_for(TTL);
    let bound = TTL + slack + scaled(Duration::from_millis(500));
    let runs = runs();
    let (mut blocked, mut after_serving) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let lock = name("restart");
        let last = holder_dies(&endpoints, &lock).await;
        let waiting = contender(contender_client.clone(), &lock);
        tokio::time::sleep_until(last + kill_offset(run, runs)).await;
        let killed_at = Instant::now();
        {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                store.kill_now()?;
                store.restart_now()
            })
            .await
            .unwrap()
            .expect("kill -9 and restart etcd");
        }
        let serving = Instant::now();
        let (lease, granted) = waiting.await.unwrap();
        // The downtime is the operator's, not slack.
        let counted = granted.saturating_duration_since(last) - (serving - killed_at);
        eprintln!(
            "run {run}: killed {:?} after the last renewal, serving again {:?} later, \
             contender granted {:?} after that",
            killed_at - last,
            serving - killed_at,
            granted.saturating_duration_since(serving)
        );
        assert!(
            counted <= bound,
            "L1: granted {counted:?} after the dead holder's last renewal (downtime excluded), \
             beyond TTL + slack ({TTL:?} + {slack:?}, + 500 ms to react)"
        );
        blocked.push(counted);
        after_serving.push(granted.saturating_duration_since(serving));
        let _ = contender_client.release(&lease).await;
    }
    eprintln!(
        "{}; {} (declared slack {slack:?})",
        summary(
            "restart, grant after the last renewal minus downtime",
            blocked
        ),
        summary("grant after serving again", after_serving)
    );
}
