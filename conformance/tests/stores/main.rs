//! The store launcher against the real servers: start-up (timed), durability
//! across `kill -9` + restart, pause/resume, clusters surviving a leader
//! kill, faketime, and process hygiene. Verification goes through each
//! store's own CLI (redis-cli, psql, etcdctl, ZooKeeperMain), not through the
//! launcher's probes.

mod clusters;
mod hygiene;
mod lifecycle;
mod pause;
mod urls;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use lock_conformance::kit::stores::{Kind, Store, etcd, postgres, redis, zookeeper};

fn run(program: &str, args: &[&str]) -> (bool, String) {
    match Command::new(program).args(args).output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, format!("cannot run {program}: {e}")),
    }
}

fn redis_cli(store: &Store, args: &[&str]) -> String {
    let port = store.addr().port().to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port];
    all.extend_from_slice(args);
    let (ok, out) = run("redis-cli", &all);
    assert!(ok, "redis-cli {args:?} failed: {out}");
    out.trim().to_owned()
}

fn psql(store: &Store, sql: &str) -> String {
    let url = store.url();
    let (ok, out) = run(
        "psql",
        &[
            &url,
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ],
    );
    assert!(ok, "psql {sql:?} failed: {out}\n{}", store.log_tail());
    out.trim().to_owned()
}

fn etcdctl(endpoints: &str, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--endpoints", endpoints, "--command-timeout=3s"];
    all.extend_from_slice(args);
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3").args(&all);
    match cmd.output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, format!("cannot run etcdctl: {e}")),
    }
}

/// ZooKeeper's own CLI class (a JVM start, about a second).
fn zk_cli(addr: SocketAddr, args: &[&str]) -> (bool, String) {
    let server = addr.to_string();
    let mut all = vec![
        "-Xmx64m",
        "-XX:TieredStopAtLevel=1",
        "-cp",
        "/usr/share/java/zookeeper.jar",
        "org.apache.zookeeper.ZooKeeperMain",
        "-server",
        &server,
    ];
    all.extend_from_slice(args);
    run("java", &all)
}

/// The launcher tests start their own servers. When a run points the suite
/// at external servers (`LOCK_TEST_*`, e.g. CI service containers), the
/// store binaries may be absent: those tests skip, saying so.
fn launcher_run(kinds: &[Kind]) -> bool {
    for kind in kinds {
        if kind.external_url().is_some() {
            eprintln!(
                "SKIP: launcher test: {} is set, this run uses an external {kind} server",
                kind.env_var()
            );
            return false;
        }
    }
    true
}

const ALL: &[Kind] = &[Kind::Redis, Kind::Postgres, Kind::Etcd, Kind::ZooKeeper];

fn timed<T>(f: impl FnOnce() -> std::io::Result<T>) -> (T, Duration) {
    let started = Instant::now();
    let value = f().unwrap_or_else(|e| panic!("{e}"));
    (value, started.elapsed())
}
