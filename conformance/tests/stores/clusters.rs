//! 3-member etcd clusters and ZooKeeper ensembles surviving a leader kill.

use std::time::{Duration, Instant};

use lock_conformance::kit::poll::{self, TimedOut};

use super::*;

#[test]
fn etcd_cluster_survives_leader_kill() {
    if !launcher_run(&[Kind::Etcd]) {
        return;
    }
    let (cluster, took) = timed(|| etcd::start_cluster(3));
    eprintln!("STARTUP etcd 3-member cluster {took:.2?}");
    let ports: Vec<u16> = cluster.members.iter().map(|m| m.addr().port()).collect();
    super::urls::assert_connect_form(Kind::Etcd, &cluster.url(), false, &ports);
    let all = cluster.connect_string();
    let (ok, out) = etcdctl(&all, &["put", "/distlock/before", "1"]);
    assert!(ok, "{out}");
    let killed = cluster.kill_leader().unwrap();
    let started = Instant::now();
    let others: Vec<String> = cluster
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != killed)
        .map(|(_, m)| m.endpoint())
        .collect();
    let others = others.join(",");
    let mut last = String::new();
    poll::blocking(
        Duration::from_secs(20),
        "a write after the leader kill",
        || {
            let (ok, out) = etcdctl(&others, &["put", "/distlock/after", "2"]);
            last = out;
            Ok::<_, TimedOut>(ok.then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {last}"));
    let new_leader = cluster.wait_leader(Duration::from_secs(10)).unwrap();
    assert_ne!(new_leader, killed);
    eprintln!(
        "FAILOVER etcd: writes accepted {:.2?} after the leader kill",
        started.elapsed()
    );
    cluster.members[killed].restart_now().unwrap();
    let member = cluster.members[killed].endpoint();
    let mut last = String::new();
    let what = "the restarted member catching up";
    poll::blocking(Duration::from_secs(20), what, || {
        let (ok, out) = etcdctl(
            &member,
            &[
                "get",
                "--consistency=s",
                "--print-value-only",
                "/distlock/after",
            ],
        );
        let caught_up = ok && out.trim() == "2";
        last = out;
        Ok::<_, TimedOut>(caught_up.then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}: {last}"));
}

#[test]
fn zookeeper_ensemble_survives_leader_kill() {
    if !launcher_run(&[Kind::ZooKeeper]) {
        return;
    }
    let (cluster, took) = timed(|| zookeeper::start_ensemble(3));
    eprintln!("STARTUP zookeeper 3-server ensemble {took:.2?}");
    let ports: Vec<u16> = cluster.members.iter().map(|m| m.addr().port()).collect();
    super::urls::assert_connect_form(Kind::ZooKeeper, &cluster.url(), false, &ports);
    let modes: Vec<_> = cluster
        .members
        .iter()
        .map(|m| zookeeper::mode(m.addr()).unwrap().unwrap_or_default())
        .collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );
    let killed = cluster.kill_leader().unwrap();
    let started = Instant::now();
    let new_leader = cluster.wait_leader(Duration::from_secs(30)).unwrap();
    assert_ne!(new_leader, killed);
    eprintln!(
        "FAILOVER zookeeper: new leader {:.2?} after the leader kill",
        started.elapsed()
    );
    let (ok, out) = zk_cli(
        cluster.members[new_leader].addr(),
        &["create", "/distlock-failover", "x"],
    );
    assert!(ok && out.contains("Created"), "{out}");
    cluster.members[killed].restart_now().unwrap();
    assert_eq!(
        zookeeper::mode(cluster.members[killed].addr())
            .unwrap()
            .as_deref(),
        Some("follower")
    );
}
