//! ZooKeeper: lock cycles next to the raw create + delete floor (an
//! ephemeral sequential node, the kind of node a queue recipe creates) on
//! the same session, and the `zookeeper-client` crate's own lock recipe
//! (Curator-compatible `Client::lock`), uncontended and contended. The JVM
//! is warmed up first. Scale scenarios count the packets the server
//! received and its connections (`mntr`).
//!
//! Every write waits for the server's fsync, whose latency swings with the
//! disk load of everything else on the machine far more than the adapter's
//! own cost: the kinds take turns (see `harness::interleaved`), and only
//! their ratios mean much on a busy host.
//!
//! Built only with the `zookeeper` feature (the adapter's migration to the
//! new lockcore API lands separately).

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lock_zookeeper::zk;
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};
use lockcore::LockBackend;
use lockcore::backend::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Client, Held, Shared, op};
use crate::lineup::{self, Lineup};
use crate::report::Report;
use crate::scale::{self, Pool, Probe};

const BACKEND: &str = "zookeeper";
const FLOOR_DIR: &str = "/distlock-bench-floor";
const RECIPE_DIR: &str = "/distlock-bench-recipe";

/// A session of `timeout`: a lease lives as long as its session.
fn config(url: &str, timeout: Duration) -> ZooKeeperConfig {
    ZooKeeperConfig::new(url).session_timeout(timeout)
}

const SESSION: Duration = Duration::from_secs(10);

async fn connect(url: &str, session: Duration) -> Arc<dyn LockBackend> {
    Arc::new(
        ZooKeeperBackend::connect_with(config(url, session))
            .await
            .expect("connect"),
    )
}

fn open() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn ephemeral_sequential() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

/// One create (ephemeral sequential) and one delete, back to back; with
/// `list`, a listing of the parent sent right behind the create, as a queue
/// recipe that reads the queue on every acquisition does.
async fn floor_cycle(client: zk::Client, list: bool) {
    let prefix = format!("{FLOOR_DIR}/n-");
    let create = client.create(&prefix, b"", &ephemeral_sequential());
    let listing = list.then(|| client.list_children(FLOOR_DIR));
    let (_, seq) = create.await.expect("create");
    if let Some(listing) = listing {
        listing.await.expect("list");
    }
    client
        .delete(&format!("{FLOOR_DIR}/n-{seq}"), None)
        .await
        .expect("delete");
}

pub(crate) async fn run(settings: Settings) -> Report {
    let store = lock_conformance::kit::stores::zookeeper::shared();
    let url = store.endpoint();
    let backend = ZooKeeperBackend::connect_with(config(&url, SESSION))
        .await
        .expect("connect");
    let client = backend.client().expect("zk client");
    client.mkdir(FLOOR_DIR, &open()).await.expect("floor dir");
    client.mkdir(RECIPE_DIR, &open()).await.expect("recipe dir");
    let probe = Server {
        addr: store.addr(),
        pid: (!store.is_external()).then(|| store.pid()).flatten(),
    };

    let floor = |list: bool| {
        let client = client.clone();
        op(move || floor_cycle(client.clone(), list))
    };
    // Warm the JVM (JIT, caches): its compiler threads keep busy for
    // several seconds after start.
    if !settings.smoke {
        let warm = settings.warmup.max(Duration::from_secs(3));
        harness::interleaved(
            &[floor(false), floor(true)],
            &Settings {
                warmup: Duration::ZERO,
                run: warm,
                ..settings.clone()
            },
        )
        .await;
    }
    let exists = {
        let client = client.clone();
        op(move || {
            let client = client.clone();
            async move {
                client.check_stat(FLOOR_DIR).await.expect("exists");
            }
        })
    };
    let round_trip = harness::timed(&exists, settings.warmup, settings.run / 2).await;

    let mut contenders = Vec::new();
    let mut recipes = Vec::new();
    for _ in 0..settings.contenders {
        contenders.push(connect(&url, SESSION).await);
        recipes.push(Recipe::connect(&url).await);
    }
    let lineup = Lineup {
        backend: BACKEND.into(),
        round_trip: Some(("exists".into(), round_trip)),
        floor: Some((
            "create (sequential ephemeral) + delete, one session".into(),
            floor(false),
        )),
        other_floors: vec![(
            "the floor + a pipelined children listing".into(),
            floor(true),
        )],
        peers: vec![(
            "zookeeper-client lock recipe".into(),
            harness::cycle(Recipe::connect(&url).await),
        )],
        contended_peers: vec![("zookeeper-client lock recipe".into(), recipes)],
        backend_instance: Arc::new(backend),
        contenders,
        floor_target: Some(0.75),
    };
    let mut report = lineup::measure(lineup, &settings).await;
    // The floor's session would ping through the scale scenarios, whose
    // counts are the adapter's alone.
    drop((exists, client));
    let mntr = probe.mntr().await.unwrap_or_default();
    report.store(
        BACKEND,
        format!(
            "ZooKeeper {}",
            field(&mntr, "zk_version").unwrap_or_else(|| "?".into())
        ),
        "standalone server launched by the bench; forceSync=yes (the default: fsync before every write's reply)",
    );
    report.extend(
        scale::run(
            BACKEND,
            // The scenarios' short TTL is the session timeout.
            || {
                let (url, session) = (url.clone(), settings.renew_ttl.max(Duration::from_secs(1)));
                async move { connect(&url, session).await }.boxed()
            },
            &probe,
            Pool {
                size: 1,
                what: "one session".into(),
            },
            &settings,
        )
        .await,
    );
    report
}

/// A ZooKeeper server's own counters, from the `mntr` four-letter word.
struct Server {
    addr: std::net::SocketAddr,
    pid: Option<u32>,
}

impl Server {
    async fn mntr(&self) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.ok()?;
        stream.write_all(b"mntr").await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        Some(text)
    }
}

fn field(mntr: &str, name: &str) -> Option<String> {
    mntr.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('\t'))
        .map(|v| v.trim().to_string())
}

#[async_trait]
impl Probe for Server {
    fn unit(&self) -> &'static str {
        "packets received (mntr)"
    }
    async fn requests(&self) -> Option<u64> {
        field(&self.mntr().await?, "zk_packets_received")?
            .parse()
            .ok()
    }
    async fn connections(&self) -> Option<u64> {
        field(&self.mntr().await?, "zk_num_alive_connections")?
            .parse()
            .ok()
    }
    fn pid(&self) -> Option<u32> {
        self.pid
    }
}

/// The `zookeeper-client` crate's lock recipe: `acquire` is `Client::lock`
/// (a sequential ephemeral node, then wait on the predecessor), release
/// drops the lock client (which deletes the node in the background). No
/// fencing token.
struct Recipe {
    client: zk::Client,
}

impl Recipe {
    async fn connect(url: &str) -> Shared {
        let client = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .expect("connect recipe client");
        Arc::new(Recipe { client })
    }
}

#[async_trait]
impl Client for Recipe {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let prefix = zk::LockPrefix::new_curator(RECIPE_DIR, "lock-").expect("prefix");
        let options = zk::LockOptions::new(zk::Acls::anyone_all());
        let lock = tokio::time::timeout_at(deadline, self.client.lock(prefix, b"", options))
            .await
            .ok()?
            .expect("recipe lock")
            .into_owned();
        Some(Box::new(lock))
    }

    async fn release(&self, held: Held) {
        // Dropping the lock client deletes its node.
        drop(
            held.downcast::<zk::OwnedLockClient>()
                .expect("a recipe lock"),
        );
    }
}
