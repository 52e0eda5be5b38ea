//! Shared test setup: the session timeout tests use, and connecting.

#![allow(dead_code)]

use std::time::Duration;

use lock_conformance::StoreFactory;
use lock_conformance::kit::stores;
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError};

/// The session timeout the tests ask for: 4 s, stretched by
/// `LOCK_TEST_TIME_SCALE` (the harness's ZooKeeper allows 1 s to 60 s).
pub(crate) fn session_timeout() -> Duration {
    Duration::from_secs(4).mul_f64(time_scale())
}

pub(crate) use lock_conformance::kit::time_scale;

/// The servers' tick: the launcher's (`ci/docker-compose.yml` uses the same).
pub(crate) fn tick() -> Duration {
    Duration::from_millis(stores::zookeeper::Options::default().tick_ms.into())
}

/// The servers' sweep of expired TTL nodes (`znode.container.checkIntervalMs`):
/// the launcher's (`ci/docker-compose.yml` uses the same).
pub(crate) fn container_check_interval() -> Duration {
    Duration::from_millis(
        stores::zookeeper::Options::default()
            .container_check_ms
            .into(),
    )
}

/// The configuration of a test client of `connect`: the tests' session
/// timeout, the servers' tick and their sweep of TTL nodes.
pub(crate) fn config(connect: impl Into<String>) -> ZooKeeperConfig {
    ZooKeeperConfig::from_url(&connect.into())
        .expect("a zk:// URL or a connect string")
        .session_timeout(session_timeout())
        .tick_time(tick())
        .container_check_interval(container_check_interval())
}

/// Connects a test client to `connect` with the tests' session timeout.
pub(crate) async fn connect(connect: String) -> Result<ZooKeeperBackend, LockError> {
    ZooKeeperBackend::connect_with(config(connect)).await
}

/// The conformance factory: the shared ZooKeeper, proxies, private servers.
pub(crate) fn factory() -> StoreFactory {
    lock_conformance::StoreFactory::zookeeper(connect)
}

/// Connects with the tests' session timeout and `configure` applied.
pub(crate) async fn connect_with(
    connect: &str,
    configure: impl FnOnce(ZooKeeperConfig) -> ZooKeeperConfig,
) -> Result<ZooKeeperBackend, LockError> {
    ZooKeeperBackend::connect_with(configure(config(connect))).await
}

/// A test client of the shared ZooKeeper through a fault proxy of its own,
/// and a plain client straight to the server, to look at what it wrote.
pub(crate) async fn behind_proxy() -> (
    lock_conformance::kit::proxy::FaultProxy,
    ZooKeeperBackend,
    lock_zookeeper::zk::Client,
) {
    let store = stores::zookeeper::shared();
    let proxy = lock_conformance::kit::proxy::FaultProxy::start(store.addr())
        .await
        .unwrap();
    let client = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    (proxy, client, raw(&store.endpoint()).await)
}

/// A plain ZooKeeper client, to look at (or tamper with) what the backend wrote.
pub(crate) async fn raw(connect: &str) -> lock_zookeeper::zk::Client {
    lock_zookeeper::zk::Client::connect(connect)
        .await
        .unwrap_or_else(|e| panic!("raw client to {connect}: {e}"))
}

/// A lock name no other test (or rerun) uses.
pub(crate) fn unique(what: &str) -> lockcore::LockName {
    lockcore::LockName::new(format!("zk-tests/{what}/{}", uuid::Uuid::new_v4().simple())).unwrap()
}

/// Takes `name` at once (it must be free) and returns the lease.
pub(crate) async fn take(backend: &ZooKeeperBackend, name: &lockcore::LockName) -> lockcore::Lease {
    backend
        .try_acquire_for(name, backend.session_timeout())
        .await
        .unwrap()
        .into_lease()
        .unwrap_or_else(|| panic!("{name} was expected to be free"))
}

/// The children of `path` (none if it does not exist).
pub(crate) async fn children(client: &lock_zookeeper::zk::Client, path: &str) -> Vec<String> {
    match client.list_children(path).await {
        Ok(children) => children,
        Err(lock_zookeeper::zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("listing {path}: {e}"),
    }
}

/// Deletes the lock parent `parent`, as the container reaper does once it
/// is empty (and may have done already: the kit's servers sweep every few
/// hundred milliseconds).
pub(crate) async fn delete_parent(client: &lock_zookeeper::zk::Client, parent: &str) {
    match client.delete(parent, None).await {
        Ok(()) | Err(lock_zookeeper::zk::Error::NoNode) => {}
        Err(e) => panic!("deleting {parent}: {e}"),
    }
}

/// Creates the lock parent `path` (and what is missing above it) as plain
/// persistent nodes, not containers: the kit's servers sweep empty
/// containers every few hundred milliseconds (for TTL nodes), and a test
/// whose request count or lost replies depend on the parent staying while
/// the queue is empty must not race that sweep.
pub(crate) async fn lasting_parent(client: &lock_zookeeper::zk::Client, path: &str) {
    let mode = lock_zookeeper::zk::CreateMode::Persistent
        .with_acls(lock_zookeeper::zk::Acls::anyone_all());
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at = format!("{at}/{part}");
        match client.create(&at, &[], &mode).await {
            Ok(_) | Err(lock_zookeeper::zk::Error::NodeExists) => {}
            Err(e) => panic!("creating {at}: {e}"),
        }
    }
}

/// Whether this test may launch ZooKeeper servers of its own. Not when
/// `LOCK_TEST_ZOOKEEPER_URL` names an external server (as in the container CI
/// job, where no ZooKeeper is installed): like the suite's crash cases, the
/// test then skips, saying so. Otherwise it launches them, and fails loudly
/// if it cannot.
pub(crate) fn may_launch_servers(test: &str) -> bool {
    // The variable itself, as the launcher reads it: no server is started
    // (and no thread) just to find out.
    let external = lock_conformance::kit::env::ZOOKEEPER_URL.is_set();
    if external {
        eprintln!(
            "SKIP {test}: LOCK_TEST_ZOOKEEPER_URL names an external server; this test launches and kills its own"
        );
    }
    !external
}

/// The reply to four-letter command `command` from the server at `addr`.
fn four_letters(addr: std::net::SocketAddr, command: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("four-letter connection");
    conn.write_all(command.as_bytes()).unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    reply
}

/// The last zxid the server at `addr` processed (`srvr`'s `Zxid:` line).
pub(crate) fn zxid(addr: std::net::SocketAddr) -> i64 {
    let reply = four_letters(addr, "srvr");
    let hex = reply
        .lines()
        .find_map(|l| l.strip_prefix("Zxid: 0x"))
        .unwrap_or_else(|| panic!("no Zxid in {reply}"));
    i64::from_str_radix(hex.trim(), 16).unwrap()
}

/// The `cons` four-letter command's line for session `sid` on the server at
/// `addr` (one line per connection of that session).
pub(crate) fn connections(addr: std::net::SocketAddr, sid: i64) -> Vec<String> {
    let session = format!("sid=0x{sid:x},");
    four_letters(addr, "cons")
        .lines()
        .filter(|l| l.contains(&session))
        .map(str::to_owned)
        .collect()
}

/// The paths session `sid` watches on the server at `addr` (`wchc`).
pub(crate) fn watches(addr: std::net::SocketAddr, sid: i64) -> Vec<String> {
    let session = format!("0x{sid:x}");
    let reply = four_letters(addr, "wchc");
    let mut lines = reply.lines().skip_while(|l| l.trim() != session).skip(1);
    std::iter::from_fn(|| lines.next().filter(|l| l.starts_with(char::is_whitespace)))
        .map(|l| l.trim().to_owned())
        .collect()
}

/// How many requests the server has answered on session `sid`: the last
/// request id (`lcxid`) that `cons` reports for it (pings and watch events
/// have ids of their own, outside this count).
pub(crate) fn answered(addr: std::net::SocketAddr, sid: i64) -> u64 {
    u64::from_str_radix(&session_stat(addr, sid, "lcxid=0x"), 16).unwrap()
}

/// How many of session `sid`'s requests the server has received and not yet
/// answered (`queued` in `cons`). The server counts a request answered only
/// after it has recorded its `lcxid`, so at 0 [`answered`] is up to date.
fn unanswered(addr: std::net::SocketAddr, sid: i64) -> u64 {
    session_stat(addr, sid, "queued=").parse().unwrap()
}

/// The value of the field starting with `prefix` in session `sid`'s `cons`
/// line, e.g. `/127.0.0.1:5678[1](queued=0,recved=9,...,lcxid=0x8,...)`.
fn session_stat(addr: std::net::SocketAddr, sid: i64, prefix: &str) -> String {
    let lines = connections(addr, sid);
    let line = lines
        .first()
        .unwrap_or_else(|| panic!("session 0x{sid:x} not in `cons`"));
    line.split(['(', ',', ')'])
        .find_map(|f| f.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {line}"))
        .to_owned()
}

/// How long a test drops a client's requests so that one is lost while the
/// connection lives on: the client pings after 3/20 of the session timeout
/// without sending and gives a connection up after 2/5 without hearing
/// back, so a drop of 3/20 swallows at most the ping sent as it ends. (If
/// the connection breaks all the same, the lost request fails and is sent
/// again: the tests' bounds hold either way, they only prove less.)
pub(crate) fn silent_drop(backend: &ZooKeeperBackend) -> Duration {
    backend.session_timeout() * 3 / 20
}

/// The session id of `backend`'s current session.
pub(crate) fn session_id(backend: &ZooKeeperBackend) -> i64 {
    backend.client().unwrap().session_id().0
}

/// This process's peak resident set so far (`VmHWM`), in bytes.
pub(crate) fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A `Locker` over `backend` for tests: the session timeout as TTL (what
/// every lease gets anyway), waits of up to a minute.
pub(crate) fn locker(backend: &ZooKeeperBackend) -> lockcore::Locker {
    lockcore::Locker::new(backend.clone())
        .ttl(backend.session_timeout())
        .max_wait(Duration::from_secs(60))
}

/// CPU time this process has used so far (user + system).
pub(crate) fn cpu_time() -> Duration {
    lock_conformance::kit::usage::own_cpu_time()
}

/// An allowance for one round trip to the store on this machine: four times
/// the slowest of a few `inspect` calls, plus 100 ms, scaled.
pub(crate) async fn round_trip(backend: &ZooKeeperBackend) -> Duration {
    use lockcore::backend::LockBackendExt;
    let name = unique("rtt");
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = tokio::time::Instant::now();
        backend.inspect(&name).await.unwrap();
        slowest = slowest.max(started.elapsed());
    }
    (slowest * 4 + Duration::from_millis(100)).mul_f64(time_scale())
}

/// Takes `name` on `backend` and reads the ACL of its node: who the lock
/// node belongs to. The lease is returned, still held.
pub(crate) async fn held_node_acl(
    backend: &ZooKeeperBackend,
    name: &lockcore::LockName,
) -> (lockcore::Lease, Vec<lock_zookeeper::zk::Acl>) {
    let lease = take(backend, name).await;
    let client = backend.client().unwrap();
    let parent = backend.lock_path(name);
    let nodes = children(&client, &parent).await;
    let (acl, _) = client
        .get_acl(&format!("{parent}/{}", nodes[0]))
        .await
        .unwrap();
    (lease, acl)
}

/// The system clocks, a fixed time behind: a grant stamped on it counts
/// from a send that long ago (as if its request had been slow), so its
/// local deadline comes that much early, long before its session could
/// end.
#[derive(Debug)]
pub(crate) struct Behind(pub(crate) Duration);

impl lockcore::backend::Clock for Behind {
    fn now(&self) -> lockcore::backend::Moment {
        let now = lockcore::backend::Moment::now();
        lockcore::backend::Moment::from_parts(
            now.mono() - self.0,
            now.boot().map(|b| b.saturating_sub(self.0)),
        )
    }
}

/// A grant of `name` (free) stamped on a clock [`Behind`] by so much that
/// its local deadline is `left` away, and so is every renewal's.
pub(crate) async fn short_lived(
    backend: &ZooKeeperBackend,
    name: &lockcore::LockName,
    left: Duration,
) -> lockcore::Lease {
    let ttl = backend
        .capabilities()
        .effective_ttl(backend.session_timeout())
        .unwrap();
    // The margin this backend's grants keep, from one taken and let go.
    let margin = {
        let lease = take(backend, name).await;
        backend.release(&lease).await.unwrap();
        lease.margin()
    };
    let clock = std::sync::Arc::new(Behind(ttl.get() - margin - left));
    let request = lockcore::backend::LockRequest::new(name.clone(), ttl).with_clock(clock);
    backend
        .try_acquire(&request)
        .await
        .unwrap()
        .into_lease()
        .unwrap_or_else(|| panic!("{name} was expected to be free"))
}

/// Waits until `backend`'s session watches a node of `name`'s queue: a
/// holder's keeper watches its granted node within the declared eviction
/// notice of the grant (from then on the client hears of the node's
/// deletion); a waiter's view watches the node ahead right after it queued. It also
/// waits until the server has answered the request that set the watch: the
/// server registers the watch before it records the request as answered, so
/// a count of [`answered`] requests taken in between would miss it.
pub(crate) async fn until_node_watched(
    store: &stores::Store,
    backend: &ZooKeeperBackend,
    name: &lockcore::LockName,
) {
    let sid = session_id(backend);
    let node = format!("{}/", backend.lock_path(name));
    let notice = backend.capabilities().eviction_notice.unwrap();
    let within = notice * 4 + lock_conformance::kit::scaled(Duration::from_secs(1));
    lock_conformance::kit::poll::eventually(within, "the node watched", || async {
        let watched = watches(store.addr(), sid);
        let settled = unanswered(store.addr(), sid) == 0;
        (settled && watched.iter().any(|p| p.starts_with(&node))).then_some(())
    })
    .await;
}

/// Curator's KillSession: while `backend`'s client is cut off by `proxy`
/// (so it cannot take its session back), another connection takes its
/// session over with its id and password and closes it. The servers then
/// delete the session's ephemeral nodes, as when a session expires.
/// Returns once `closed` holds (within the session timeout), with the proxy
/// passing again: the client reconnects and hears that its session is over.
pub(crate) async fn kill_session<F, Fut>(
    store: &stores::Store,
    proxy: &lock_conformance::kit::proxy::FaultProxy,
    backend: &ZooKeeperBackend,
    closed: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    use lock_conformance::kit::proxy::Mode;
    proxy.set(Mode::Refuse);
    proxy.reset_existing();
    let killer = lock_zookeeper::zk::Client::connector()
        .with_session(backend.client().unwrap().session().clone())
        .connect(&store.endpoint())
        .await
        .unwrap();
    drop(killer);
    let within = backend.session_timeout();
    lock_conformance::kit::poll::until(within, "the session closed on the servers", closed).await;
    proxy.set(Mode::Pass);
}
