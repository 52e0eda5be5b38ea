//! Shared setup for the focused test files: private servers, raw
//! connections, unique names, and timing bounds derived from what the
//! backend declares and a measured round trip.

#![allow(dead_code)]

use std::time::Duration;

use lock_conformance::kit::proxy::FaultProxy;
use lock_conformance::kit::stores::Store;
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_conformance::kit::until;
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, Backoff, Lease, LockName, Locker};
use tokio::time::Instant;

/// A TTL no test outlives.
pub(crate) const LONG: Duration = Duration::from_secs(60);

/// `d` stretched by `LOCK_TEST_TIME_SCALE` (default 1.0).
pub(crate) use lock_conformance::kit::scaled;

/// A lock name no other test (or rerun) uses.
pub(crate) fn unique(what: &str) -> LockName {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    LockName::new(format!(
        "redis-tests/{what}/{nanos:x}-{}",
        std::process::id()
    ))
    .unwrap()
}

/// A private `redis-server` of this test, to configure, kill or restart.
pub(crate) async fn private(options: Options) -> Store {
    tokio::task::spawn_blocking(move || launcher::start(options))
        .await
        .expect("launcher thread")
        .expect("redis-server must be installed (apt-get install redis-server)")
}

/// A plain connection, to look at (or tamper with) what the backend wrote.
/// Its timeouts are generous (the client's own 500 ms are not): it is the
/// test's observer, not what is tested, and the shared server of a binary
/// that runs many tests at once can be slow to answer a `KEYS`.
pub(crate) async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    let patient = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(scaled(Duration::from_secs(10))))
        .set_response_timeout(Some(scaled(Duration::from_secs(10))));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&patient)
        .await
        .expect("raw connection")
}

/// A backend whose replies may take the default response timeout (1 s)
/// scaled, for cases that send a burst (thousands of grants, a fence floor
/// of 16,384 keys written durably) and check what happens, not how fast:
/// on a loaded machine a burst must not read as a lost server.
/// A client of `store` through a fresh fault proxy, with 300 ms timeouts
/// so a cut shows at once, and a client straight to it.
pub(crate) async fn cut_and_direct(store: &Store) -> (FaultProxy, RedisBackend, RedisBackend) {
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    let cut = RedisBackend::connect_with(via).await.unwrap();
    let direct = RedisBackend::connect(&store.url()).await.unwrap();
    (proxy, cut, direct)
}

pub(crate) async fn connect_scaled(url: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .unwrap()
        .response_timeout(scaled(RedisConfig::DEFAULT_RESPONSE_TIMEOUT));
    RedisBackend::connect_with(config).await.unwrap()
}

/// Takes `name` at once (it must be free) and returns the lease.
pub(crate) async fn take(backend: &RedisBackend, name: &LockName, ttl: Duration) -> Lease {
    match backend
        .try_acquire_for(name, ttl)
        .await
        .expect("try_acquire")
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{name} should be free"),
    }
}

/// An allowance for one round trip to `backend`'s server on this machine,
/// as the conformance suite computes it: four times the slowest of five
/// `inspect` calls, plus 100 ms, scaled.
pub(crate) async fn round_trip(backend: &RedisBackend) -> Duration {
    let probe = unique("round-trip");
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        backend.inspect(&probe).await.expect("inspect");
        slowest = slowest.max(started.elapsed());
    }
    scaled(slowest * 4 + Duration::from_millis(100))
}

/// Connections of `type` (e.g. `pubsub`) the server has open.
pub(crate) async fn clients_of_type(con: &redis::aio::MultiplexedConnection, kind: &str) -> usize {
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg(kind)
        .query_async(&mut con.clone())
        .await
        .unwrap();
    clients.lines().count()
}

/// A random number, to keep reruns against one server apart.
pub(crate) fn rand_u64() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
}

/// How many times the server ran `command` (INFO commandstats), e.g.
/// `evalsha`.
pub(crate) async fn command_calls(con: &redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |n| n.parse().unwrap())
}

pub(crate) fn queue_key(lock: &LockName) -> String {
    format!("distlock:{{{}}}:queue", lock.as_str())
}

pub(crate) async fn queue_len(con: &redis::aio::MultiplexedConnection, lock: &LockName) -> usize {
    con.clone().zcard(queue_key(lock)).await.unwrap()
}

/// The waits in `lock`'s line: at least `n`, within 10 s (scaled).
pub(crate) async fn in_line(con: &redis::aio::MultiplexedConnection, lock: &LockName, n: usize) {
    until(
        scaled(Duration::from_secs(10)),
        &format!("{n} in line"),
        || async { queue_len(con, lock).await >= n },
    )
    .await;
}

pub(crate) async fn pubsub_clients(con: &redis::aio::MultiplexedConnection) -> usize {
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    clients.lines().count()
}

pub(crate) async fn wake_channels(con: &redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("distlock:wake:*")
        .query_async(&mut con.clone())
        .await
        .unwrap()
}

/// A waiter that only the store can wake: re-checks and backoff are a minute.
pub(crate) fn patient(backend: RedisBackend) -> Locker {
    Locker::new(backend)
        .ttl(LONG)
        .max_wait(Duration::from_secs(60))
        .recheck(Duration::from_secs(60))
        .backoff(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
}

/// The server clock in microseconds (what fences never go below).
pub(crate) async fn server_micros(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    secs * 1_000_000 + micros
}

/// Copies `from` (a directory of files) to `to`, replacing `to`.
pub(crate) fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// The grant `client` waits for once a failover's lock delay (`delay`,
/// seen at `seen`) is over, checked: none sooner than the delay (the
/// server counts it in whole milliseconds of its clock: the backend's
/// slack), none while `lost`, the lease the failover lost, was still valid
/// for its holder, and a larger fence. Released before it returns.
pub(crate) async fn granted_after_the_lock_delay(
    client: &RedisBackend,
    name: &LockName,
    (delay, seen): (Duration, Instant),
    lost: &Lease,
) {
    let wait = lockcore::backend::wait::WaitPolicy::new(Instant::now() + delay * 4);
    let lease = client
        .acquire_for(name, lost.ttl().get(), &wait)
        .await
        .unwrap()
        .expect("granted once the lock delay is over");
    let granted = Instant::now();
    let slack = lockcore::LockBackend::capabilities(client).expiry_slack;
    assert!(
        granted + slack >= seen + delay,
        "granted {:?} after the failover was seen, within the {delay:?} lock delay",
        granted - seen
    );
    assert!(
        granted > lost.deadline(),
        "granted while the lost lease was still valid for its holder"
    );
    assert!(lease.fence() > lost.fence(), "fences keep growing");
    lockcore::LockBackend::release(client, &lease)
        .await
        .unwrap();
}
