//! A 3-member etcd cluster from the harness: fencing tokens (create
//! revisions) keep growing across a leader `kill -9` and a member
//! `kill -9` + restart, and no two clients hold the lock at once meanwhile;
//! and the whole conformance suite against such a cluster ([`conformance`]).

mod conformance;

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::stores::etcd;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{Backoff, FencedResource, FencingToken, LockBackend, Locker};
use tokio::time::Instant;

async fn connect(endpoints: &[String]) -> EtcdBackend {
    EtcdBackend::connect_with(
        EtcdConfig::new(endpoints.to_vec()).request_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connect to the cluster")
}

fn locker(backend: &EtcdBackend) -> Locker {
    Locker::new(backend.clone())
        .ttl(Duration::from_secs(3))
        .max_wait(Duration::from_secs(30))
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(300),
        ))
        .recheck(Duration::from_millis(500))
}

/// `rounds` acquire/write/release cycles alternating between clients, each
/// write fenced; returns the fences in grant order.
async fn cycles(
    clients: &[Locker],
    resource: &FencedResource<u64>,
    rounds: usize,
) -> Vec<FencingToken> {
    let mut fences = Vec::new();
    for i in 0..rounds {
        let locker = &clients[i % clients.len()];
        let guard = locker
            .acquire("cluster/cycles")
            .await
            .expect("acquire through faults");
        resource
            .write(guard.fencing_token(), |v| *v += 1)
            .expect("a fresh grant's write is never refused");
        fences.push(guard.fencing_token());
        let _ = guard.release().await;
    }
    fences
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_grow_across_leader_kill_and_member_restart() {
    let cluster = tokio::task::spawn_blocking(|| etcd::start_cluster(3))
        .await
        .unwrap()
        .expect("a 3-member etcd cluster");
    let endpoints = cluster.endpoints();
    let backends = [connect(&endpoints).await, connect(&endpoints).await];
    let clients: Vec<Locker> = backends.iter().map(locker).collect();
    let resource = FencedResource::new(0_u64);
    let mut fences = cycles(&clients, &resource, 10).await;

    // A holder across the leader's death: either it keeps the lock (and then
    // nobody else gets it) or its guard says it lost it first.
    let holder = clients[0].acquire("cluster/held").await.unwrap();
    let held_fence = holder.fencing_token();
    let cluster = Arc::new(cluster);
    let killed = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.kill_leader())
            .await
            .unwrap()
            .expect("kill the leader")
    };
    let killed_at = Instant::now();
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.wait_leader(Duration::from_secs(20)))
            .await
            .unwrap()
            .expect("a new leader");
    }
    let contender = tokio::spawn({
        let locker = clients[1].clone();
        async move { locker.acquire("cluster/held").await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if contender.is_finished() {
        assert!(
            !holder.is_held(),
            "S1: the contender got the lock while the holder still held it"
        );
    }
    let still_held = holder.is_held();
    let _ = holder.release().await;
    let next = contender
        .await
        .unwrap()
        .expect("the contender gets it after the release");
    assert!(
        next.fencing_token() > held_fence,
        "fence after the leader kill"
    );
    eprintln!(
        "leader {killed} killed; holder kept the lock through the election: {still_held}; \
         hand-off {:?} after the kill",
        killed_at.elapsed()
    );
    let _ = next.release().await;

    fences.extend(cycles(&clients, &resource, 10).await);

    // The killed member comes back on its data, catches up, and serves.
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.members[killed].restart_now())
            .await
            .unwrap()
            .expect("restart the killed member");
    }
    let rejoined = connect(&[cluster.members[killed].endpoint()]).await;
    fences.extend(cycles(&[locker(&rejoined)], &resource, 5).await);

    // kill -9 a follower and restart it while clients keep going.
    let follower = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            let leader = cluster.wait_leader(Duration::from_secs(20))?;
            let follower = (leader + 1) % cluster.members.len();
            cluster.members[follower].kill_now()?;
            Ok::<_, std::io::Error>(follower)
        })
        .await
        .unwrap()
        .expect("kill a follower")
    };
    fences.extend(cycles(&clients, &resource, 10).await);
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.members[follower].restart_now())
            .await
            .unwrap()
            .expect("restart the follower");
    }
    fences.extend(cycles(&clients, &resource, 10).await);

    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "F1/F2: fences must strictly grow across the faults: {fences:?}"
    );
    assert!(fences.iter().all(|f| *f > FencingToken::new(1).unwrap()));
    assert_eq!(resource.rejected(), 0, "no fenced write was refused");
    assert_eq!(resource.read(), fences.len() as u64);
    for backend in &backends {
        assert!(backend.capabilities().min_ttl <= Duration::from_secs(1));
    }
}
