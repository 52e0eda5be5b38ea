//! Start-up (times reported, not asserted: each launcher fails loudly when
//! its store is not ready within its own bound), durability across `kill -9` + restart, the PostgreSQL
//! user and clock, etcd's short leases.

use std::path::PathBuf;
use std::time::Instant;

use super::*;

#[test]
fn every_store_starts_and_serves() {
    if !launcher_run(ALL) {
        return;
    }
    // One by one, then all four at once (what a test run of every adapter sees).
    let (r, t_redis) = timed(|| redis::start(redis::Options::default()));
    let (p, t_pg) = timed(|| postgres::start(postgres::Options::default()));
    let (e, t_etcd) = timed(|| etcd::start(etcd::Options::default()));
    let (z, t_zk) = timed(|| zookeeper::start(zookeeper::Options::default()));
    assert_eq!(redis_cli(&r, &["PING"]), "PONG");
    assert_eq!(psql(&p, "select 40 + 2"), "42");
    let (ok, out) = etcdctl(&e.endpoint(), &["endpoint", "health"]);
    assert!(
        ok && out.contains("is healthy"),
        "etcdctl endpoint health: {out}"
    );
    let (ok, out) = zk_cli(z.addr(), &["ls", "/"]);
    assert!(ok && out.contains("zookeeper"), "zkCli ls /: {out}");
    for store in [&r, &p, &e, &z] {
        assert!(!store.is_external() && store.is_running(), "{store:?}");
        assert!(store.data_dir().is_some_and(|d| d.is_dir()));
    }
    let dirs: Vec<PathBuf> = [&r, &p, &e, &z]
        .iter()
        .map(|s| s.data_dir().unwrap().to_owned())
        .collect();
    let stopping = Instant::now();
    drop((r, p, e, z));
    let t_stop = stopping.elapsed();
    for dir in dirs {
        assert!(!dir.exists(), "{} must be removed on drop", dir.display());
    }

    let started = Instant::now();
    let handles = vec![
        std::thread::spawn(|| zookeeper::start(zookeeper::Options::default())),
        std::thread::spawn(|| etcd::start(etcd::Options::default())),
        std::thread::spawn(|| redis::start(redis::Options::default())),
        std::thread::spawn(|| postgres::start(postgres::Options::default())),
    ];
    let stores: Vec<Store> = handles
        .into_iter()
        .map(|h| {
            h.join()
                .expect("launcher thread")
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let t_all = started.elapsed();
    assert!(stores.iter().all(Store::serves));
    eprintln!(
        "STARTUP redis {t_redis:.2?}, postgres {t_pg:.2?} (initdb included), etcd {t_etcd:.2?}, \
         zookeeper {t_zk:.2?}; all four in parallel {t_all:.2?}; stopping four {t_stop:.2?}"
    );
}

#[test]
fn redis_aof_always_keeps_data_across_kill9() {
    if !launcher_run(&[Kind::Redis]) {
        return;
    }
    let store = redis::start(redis::Options::durable()).unwrap();
    assert!(store.durable());
    assert_eq!(redis_cli(&store, &["INCRBY", "fence", "41"]), "41");
    let port = store.addr().port();
    let pid = store.pid().unwrap();
    store.kill_now().unwrap();
    assert!(!store.is_running() && !store.serves());
    store.restart_now().unwrap();
    assert_eq!(store.addr().port(), port, "same port after restart");
    assert_ne!(store.pid(), Some(pid), "a new process");
    assert_eq!(redis_cli(&store, &["INCR", "fence"]), "42");
}

#[test]
fn redis_without_persistence_forgets_across_kill9() {
    if !launcher_run(&[Kind::Redis]) {
        return;
    }
    // Documents the limit the Redis adapter must warn about (T3.6b).
    let store =
        redis::start(redis::Options::default().persistence(redis::Persistence::None)).unwrap();
    assert!(!store.durable());
    redis_cli(&store, &["SET", "fence", "7"]);
    store.kill_now().unwrap();
    store.restart_now().unwrap();
    assert_eq!(redis_cli(&store, &["EXISTS", "fence"]), "0");
}

#[test]
fn postgres_keeps_committed_rows_across_kill9() {
    if !launcher_run(&[Kind::Postgres]) {
        return;
    }
    let store = postgres::start(postgres::Options::default()).unwrap();
    assert!(store.durable());
    psql(&store, "create table t (v int); insert into t values (7)");
    store.kill_now().unwrap();
    assert!(!store.serves());
    store.restart_now().unwrap();
    assert_eq!(psql(&store, "select v from t"), "7");
}

#[test]
fn postgres_runs_as_the_postgres_user() {
    let store = postgres::shared();
    if store.is_external() {
        eprintln!("SKIP: external postgres");
        return;
    }
    assert_eq!(psql(&store, "select current_user"), "postgres");
    let pid = store.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .expect("a Uid line");
    assert_ne!(uid, 0, "postgres must not run as root");
}

#[test]
fn postgres_clock_can_be_stepped_under_faketime() {
    if !launcher_run(&[Kind::Postgres]) {
        return;
    }
    let store = postgres::start(postgres::Options::default().faketime(true)).unwrap();
    let skew = |store: &Store| -> f64 {
        let server: f64 = psql(store, "select extract(epoch from clock_timestamp())")
            .parse()
            .unwrap();
        let local = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        server - local
    };
    assert!(
        skew(&store).abs() < 5.0,
        "no offset at start: {}",
        skew(&store)
    );
    store.set_clock_offset(3600).unwrap();
    let ahead = skew(&store);
    assert!(
        (3590.0..3610.0).contains(&ahead),
        "clock should be 1 h ahead, is {ahead} s"
    );
    store.set_clock_offset(-60).unwrap();
    let behind = skew(&store);
    assert!(
        (-70.0..-50.0).contains(&behind),
        "clock should be 60 s behind, is {behind} s"
    );
}

#[test]
fn etcd_keeps_keys_across_kill9() {
    if !launcher_run(&[Kind::Etcd]) {
        return;
    }
    let store = etcd::start(etcd::Options::default()).unwrap();
    let (ok, out) = etcdctl(&store.endpoint(), &["put", "/distlock/k", "v1"]);
    assert!(ok, "{out}");
    store.kill_now().unwrap();
    store.restart_now().unwrap();
    let (ok, out) = etcdctl(
        &store.endpoint(),
        &["get", "--print-value-only", "/distlock/k"],
    );
    assert!(ok && out.trim() == "v1", "after restart: {out}");
}

#[test]
fn etcd_allows_one_second_leases() {
    let store = etcd::shared();
    if store.is_external() {
        eprintln!("SKIP: external etcd");
        return;
    }
    let (ok, out) = etcdctl(&store.endpoint(), &["lease", "grant", "1"]);
    assert!(
        ok && out.contains("TTL(1s)"),
        "1 s lease refused or clamped: {out}"
    );
}

#[test]
fn zookeeper_keeps_znodes_across_kill9() {
    if !launcher_run(&[Kind::ZooKeeper]) {
        return;
    }
    let store = zookeeper::start(zookeeper::Options::default()).unwrap();
    let (ok, out) = zk_cli(store.addr(), &["create", "/distlock-k", "v1"]);
    assert!(ok && out.contains("Created /distlock-k"), "{out}");
    store.kill_now().unwrap();
    store.restart_now().unwrap();
    let (ok, out) = zk_cli(store.addr(), &["get", "/distlock-k"]);
    assert!(
        ok && out.lines().any(|l| l.trim() == "v1"),
        "after restart: {out}"
    );
}
