//! Connecting: URLs and their options (every spelling, old and new), bad
//! configuration as typed errors before any I/O, and servers that give no
//! session, named within the connect timeout.

use std::time::{Duration, Instant};

use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};
use lockcore::{LockBackend, LockError};

use crate::support::{take, unique};

/// Every duration option in the one syntax, and `password_file`, against
/// the real store: the session asked for is the one granted, and the
/// password read from the file owns the root (the same identity with the
/// password in the URL may force-release; another password is refused at
/// connect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_options_and_a_password_file_reach_the_store() {
    let store = zookeeper::shared();
    let addr = store.addr();
    let root = format!("/zk-tests-url-{}", uuid::Uuid::new_v4().simple());
    let file = std::env::temp_dir().join(format!("zk-password-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, "s3cret\n").unwrap();
    let session = crate::support::session_timeout();
    let options = format!(
        "session_timeout={}ms&tick_time={}ms&connection_timeout={}ms&connect_timeout=5s",
        session.as_millis(),
        crate::support::tick().as_millis(),
        (session * 2 / 5).as_millis()
    );
    let owner = ZooKeeperBackend::connect(&format!(
        "zk://alice@{addr}{root}?{options}&password_file={}",
        file.display()
    ))
    .await;
    std::fs::remove_file(&file).unwrap();
    let owner = owner.unwrap();
    assert_eq!(owner.session_timeout(), session);
    assert_eq!(owner.config().root_path(), root);
    let name = unique("url");
    let lease = take(&owner, &name).await;

    let same = ZooKeeperBackend::connect(&format!("zk://alice:s3cret@{addr}{root}?{options}"))
        .await
        .unwrap();
    let evicted = same.evict(&name, None).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    let e = ZooKeeperBackend::connect(&format!("zk://alice:other@{addr}{root}?{options}"))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("check the digest credentials"),
        "{e}"
    );
    owner.close().await.unwrap();
    same.close().await.unwrap();
}

/// Bad URLs and settings are `InvalidConfig` before any I/O; `Debug` never
/// shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_and_unreachable_servers_are_typed_errors() {
    for url in [
        "zk://h:1/a//b",
        "zk://h:1/zookeeper",
        "zk://h:1/x?bogus=1",
        "redis://h:1",
        "zk://h:1/x?session_timeout=soon",
    ] {
        let e = ZooKeeperBackend::connect(url).await.unwrap_err();
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{url}: {e:?}");
    }
    let store = zookeeper::shared();
    let backend = ZooKeeperBackend::connect(&format!(
        "zk://alice:hunter2@{}/zk-tests-debug?session_timeout=4s",
        store.addr()
    ))
    .await
    .unwrap();
    let shown = format!("{backend:?} {:?}", backend.config());
    assert!(
        shown.contains("alice") && !shown.contains("hunter2"),
        "{shown}"
    );
}

/// Servers that give no session fail the connect within the connect
/// timeout, with an error that says what each server did: a closed port, a
/// server that accepts connections and never answers (a 30 s session gives
/// the client 12 s per server, far past the connect timeout), and an
/// ensemble of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_are_named_within_the_connect_timeout() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let silent = FaultProxy::start(zookeeper::shared().addr()).await.unwrap();
    silent.set(Mode::Blackhole);
    let limit = Duration::from_secs(3).mul_f64(crate::support::time_scale());
    let late = Duration::from_millis(500).mul_f64(crate::support::time_scale());
    let refused = format!("{closed}: connection refused");
    let unanswered = format!(
        "{}: accepts connections but gave no ZooKeeper session",
        silent.addr()
    );
    for (servers, named) in [
        (closed.to_string(), vec![refused.clone()]),
        (silent.addr().to_string(), vec![unanswered.clone()]),
        (
            format!("{closed},{}", silent.addr()),
            vec![refused, unanswered],
        ),
    ] {
        let started = Instant::now();
        let e = ZooKeeperBackend::connect_with(
            ZooKeeperConfig::new(servers.as_str())
                .session_timeout(Duration::from_secs(30))
                .connect_timeout(limit),
        )
        .await
        .unwrap_err();
        let took = started.elapsed();
        eprintln!("{servers}: {took:?}: {e}");
        assert!(matches!(e, LockError::Unavailable { .. }), "{e:?}");
        assert!(e.is_retryable());
        for cause in named {
            assert!(
                e.to_string().contains(&cause),
                "{servers}: {e} does not say {cause:?}"
            );
        }
        assert!(took <= limit + late, "{servers}: took {took:?}");
    }
}
