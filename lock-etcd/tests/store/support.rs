//! What the etcd tests share: names, clients, the time scale, etcd's own
//! metrics and this process's resource use.

#![allow(dead_code)] // each test binary uses its own part of this

use std::collections::HashMap;
use std::time::Duration;

use lock_conformance::kit::stores;
use lock_conformance::kit::stores::etcd;
use lock_etcd::etcd_client::Client;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, Lease, LockName, OwnerToken};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

pub(crate) use lock_conformance::kit::scaled;

/// A lock name no other test (or rerun) uses: `<test>/<random>`.
pub(crate) fn name(test: &str) -> LockName {
    LockName::new(format!("etcd-test/{test}/{:08x}", rand_u32())).unwrap()
}

pub(crate) fn rand_u32() -> u32 {
    OwnerToken::new().as_uuid().as_u128() as u32
}

/// A backend on `url` with default settings.
pub(crate) async fn connect(url: &str) -> EtcdBackend {
    EtcdBackend::connect_with(EtcdConfig::new([url]))
        .await
        .expect("connect to the harness etcd")
}

/// A plain etcd client, to look at what the backend wrote.
pub(crate) async fn raw(url: &str) -> Client {
    Client::connect([url], None).await.expect("raw client")
}

/// A private single-member etcd (to kill, restart or count requests on).
pub(crate) async fn private_etcd() -> stores::Store {
    tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default()))
        .await
        .unwrap()
        .expect("a private etcd")
}

/// A plain client to the etcd at `url`, after adding user `root` (with the
/// root role) so that authentication can be enabled.
pub(crate) async fn with_root_user(url: &str) -> Client {
    let mut root = raw(url).await;
    root.user_add("root", "r00t-secret", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root
}

/// `try_acquire` that must find `name` free.
pub(crate) async fn acquire(backend: &EtcdBackend, name: &LockName, ttl: Duration) -> Lease {
    match backend
        .try_acquire_for(name, ttl)
        .await
        .expect("try_acquire")
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should be free"),
    }
}

/// etcd's Prometheus metrics (served on the client port), values summed per
/// series.
pub(crate) async fn metrics(store: &stores::Store) -> HashMap<String, f64> {
    let mut conn = tokio::net::TcpStream::connect(store.addr()).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap();
    let mut values = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        *values.entry(series.to_owned()).or_default() += value;
    }
    values
}

/// gRPC calls etcd finished for `method` (`Txn`, `Range`, `LeaseTimeToLive`, ...).
pub(crate) fn handled(metrics: &HashMap<String, f64>, method: &str) -> f64 {
    sum(metrics, "grpc_server_handled_total{", method)
}

/// Messages etcd received on `method` (a stream's messages count one by one:
/// `LeaseKeepAlive`, `Watch`).
pub(crate) fn received(metrics: &HashMap<String, f64>, method: &str) -> f64 {
    sum(metrics, "grpc_server_msg_received_total{", method)
}

fn sum(metrics: &HashMap<String, f64>, family: &str, method: &str) -> f64 {
    let method = format!("grpc_method=\"{method}\"");
    metrics
        .iter()
        .filter(|(series, _)| series.starts_with(family) && series.contains(&method))
        .map(|(_, v)| v)
        .sum()
}

/// An unlabelled gauge or counter.
pub(crate) fn gauge(metrics: &HashMap<String, f64>, name: &str) -> f64 {
    metrics.get(name).copied().unwrap_or(0.0)
}

/// This process's CPU time so far.
pub(crate) fn own_cpu() -> Duration {
    lock_conformance::kit::usage::own_cpu_time()
}

/// A launched store's CPU time so far.
pub(crate) fn store_cpu(store: &stores::Store) -> Duration {
    lock_conformance::kit::usage::cpu_time(store.pid().expect("a running store"))
}

/// This process's resident set now (`VmRSS`) or at its peak (`VmHWM`), in MiB.
pub(crate) fn rss_mib(which: &str) -> f64 {
    lock_conformance::kit::usage::own_memory_mib(which)
}

/// TCP connections this process has open to `port` on loopback.
pub(crate) fn connections_to(port: u16) -> usize {
    let mine: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")?
                        .strip_suffix(']')
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
    let remote = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // rem_address is field 2, state field 3 (01 = ESTABLISHED), inode field 9.
            f.len() > 9 && f[2].ends_with(&remote) && f[3] == "01" && mine.contains(f[9])
        })
        .count()
}

/// The etcd lease behind a grant, read from etcd itself.
pub(crate) async fn etcd_lease_of(client: &mut Client, key: &[u8]) -> i64 {
    let reply = client.get(key.to_vec(), None).await.expect("get key");
    let kv = reply.kvs().first().expect("the grant's key exists");
    kv.lease()
}

/// Four times the slowest of a few round trips, plus 100 ms, scaled (as the
/// conformance suite's `Ctx::round_trip`).
pub(crate) async fn round_trip(backend: &EtcdBackend) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let sent = Instant::now();
        backend.inspect(&name("rtt")).await.unwrap();
        slowest = slowest.max(sent.elapsed());
    }
    scaled(slowest * 4 + Duration::from_millis(100))
}

/// The queue (key prefix) of the lock `lease` holds: its key up to the last
/// `/` (escaped names have none).
pub(crate) fn queue_of(lease: &Lease) -> Vec<u8> {
    let key = lock_etcd::testing::key_of(lease).expect("a lease of this backend");
    let end = key.iter().rposition(|b| *b == b'/').expect("a queue key");
    key[..=end].to_vec()
}

/// The store's revision now.
pub(crate) async fn revision(raw: &mut Client) -> i64 {
    let reply = raw.get("nothing", None).await.unwrap();
    reply.header().unwrap().revision()
}

/// How many entries the queue `queue` has right now.
pub(crate) async fn queue_len(client: &mut Client, queue: Vec<u8>) -> usize {
    let options = lock_etcd::etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    client.get(queue, Some(options)).await.unwrap().count() as usize
}
