//! Shared test setup: the session timeout tests use, and connecting.

#![allow(dead_code)]

use std::time::Duration;

pub mod tap;

use lock_conformance::stores::{self, StoreFactory};
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};
use lockcore::LockError;
use lockcore::backend::LockBackendExt;

/// The session timeout the tests ask for: 4 s, stretched by
/// `LOCK_TEST_TIME_SCALE` (the harness's ZooKeeper allows 1 s to 60 s).
pub fn session_timeout() -> Duration {
    Duration::from_secs(4).mul_f64(time_scale())
}

/// `LOCK_TEST_TIME_SCALE` (default 1.0), which stretches every timing.
pub fn time_scale() -> f64 {
    std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0)
}

/// The servers' tick: the launcher's (`ci/docker-compose.yml` uses the same).
pub fn tick() -> Duration {
    Duration::from_millis(stores::zookeeper::Options::default().tick_ms.into())
}

/// The configuration of a test client of `connect`: the tests' session
/// timeout and the servers' tick.
pub fn config(connect: impl Into<String>) -> ZooKeeperConfig {
    ZooKeeperConfig::new(connect)
        .session_timeout(session_timeout())
        .tick_time(tick())
}

/// Connects a test client to `connect` with the tests' session timeout.
pub async fn connect(connect: String) -> Result<ZooKeeperBackend, LockError> {
    ZooKeeperBackend::connect_with(config(connect)).await
}

/// The conformance factory: the shared ZooKeeper, proxies, private servers.
pub fn factory() -> StoreFactory {
    stores::zookeeper::factory(connect)
}

/// Connects with the tests' session timeout and `configure` applied.
pub async fn connect_with(
    connect: &str,
    configure: impl FnOnce(ZooKeeperConfig) -> ZooKeeperConfig,
) -> Result<ZooKeeperBackend, LockError> {
    ZooKeeperBackend::connect_with(configure(config(connect))).await
}

/// A plain ZooKeeper client, to look at (or tamper with) what the backend wrote.
pub async fn raw(connect: &str) -> lock_zookeeper::zk::Client {
    lock_zookeeper::zk::Client::connect(connect)
        .await
        .unwrap_or_else(|e| panic!("raw client to {connect}: {e}"))
}

/// A lock name no other test (or rerun) uses.
pub fn unique(what: &str) -> lockcore::LockName {
    lockcore::LockName::new(format!("zk-tests/{what}/{}", uuid::Uuid::new_v4().simple())).unwrap()
}

/// Takes `name` at once (it must be free) and returns the lease.
pub async fn take(backend: &ZooKeeperBackend, name: &lockcore::LockName) -> lockcore::Lease {
    backend
        .try_acquire_for(name, backend.session_timeout())
        .await
        .unwrap()
        .into_lease()
        .unwrap_or_else(|| panic!("{name} was expected to be free"))
}

/// The children of `path` (none if it does not exist).
pub async fn children(client: &lock_zookeeper::zk::Client, path: &str) -> Vec<String> {
    match client.list_children(path).await {
        Ok(children) => children,
        Err(lock_zookeeper::zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("listing {path}: {e}"),
    }
}

/// Whether this test may launch ZooKeeper servers of its own. Not when
/// `LOCK_TEST_ZOOKEEPER` names an external server (as in the container CI
/// job, where no ZooKeeper is installed): like the suite's crash cases, the
/// test then skips, saying so. Otherwise it launches them, and fails loudly
/// if it cannot.
pub fn may_launch_servers(test: &str) -> bool {
    // The variable itself, as the launcher reads it: no server is started
    // (and no thread) just to find out.
    let external = std::env::var("LOCK_TEST_ZOOKEEPER").is_ok_and(|v| !v.trim().is_empty());
    if external {
        eprintln!(
            "SKIP {test}: LOCK_TEST_ZOOKEEPER names an external server; this test launches and kills its own"
        );
    }
    !external
}
