//! ZooKeeper: lock cycles next to the raw create+delete floor (an ephemeral
//! sequential node, the same kind of node the recipe creates) on the same
//! session, interleaved in the same run; then N-way contention two ways: the
//! adapter's queue and the `zookeeper-client` crate's own lock recipe
//! (Curator-compatible `Client::lock`). The JVM is warmed up first.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_zookeeper::zk;
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};
use lockcore::{
    Attempt, Capabilities, Fairness, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    OwnerToken, ReleaseOutcome, WaitPolicy, async_trait,
};
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Row, Stats};

const BACKEND: &str = "zookeeper";
const FLOOR_DIR: &str = "/distlock-bench-floor";
const RECIPE_DIR: &str = "/distlock-bench-recipe";

fn config(url: &str) -> ZooKeeperConfig {
    ZooKeeperConfig::new(url).session_timeout(Duration::from_secs(10))
}

fn open() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// One create (ephemeral sequential) and one delete, back to back.
async fn floor_cycle(client: &zk::Client) {
    let node = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, seq) = client
        .create(&format!("{FLOOR_DIR}/n-"), b"", &node)
        .await
        .expect("create");
    client
        .delete(&format!("{FLOOR_DIR}/n-{seq}"), None)
        .await
        .expect("delete");
}

/// Floor and adapter cycles in alternating slices, so load from other
/// processes drifting during the run hits both alike.
async fn interleaved(
    client: &zk::Client,
    backend: &ZooKeeperBackend,
    name: &LockName,
    settings: &Settings,
) -> (Stats, Stats) {
    const SLICES: u32 = 10;
    let slice = settings.run / SLICES;
    let warmup = settings.warmup / SLICES;
    let lock: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let (mut floor, mut cycles) = (Stats::default(), Stats::default());
    for _ in 0..SLICES {
        let f = harness::timed(warmup, slice, || floor_cycle(client)).await;
        let c = harness::uncontended(lock.clone(), name, settings.ttl, warmup, slice).await;
        for (total, part) in [(&mut floor, f), (&mut cycles, c)] {
            total.elapsed += part.elapsed;
            total.samples.extend(part.samples);
        }
    }
    (floor, cycles)
}

pub async fn run(settings: &Settings) -> Vec<Row> {
    let store = lock_conformance::stores::zookeeper::shared();
    let url = store.url();
    let note = if store.is_external() {
        format!("server {}", store.addr())
    } else {
        "launched standalone server, default forceSync".to_string()
    };
    let backend = ZooKeeperBackend::connect_with(config(&url))
        .await
        .expect("connect");
    let client = backend.zk_client();
    client.mkdir(FLOOR_DIR, &open()).await.expect("floor dir");
    client.mkdir(RECIPE_DIR, &open()).await.expect("recipe dir");
    let name = LockName::new("bench/zookeeper").unwrap();
    let mut rows = Vec::new();

    // Warm the JVM (JIT, caches) with every kind of request measured below.
    let warm = Settings {
        warmup: Duration::ZERO,
        run: settings.warmup.max(Duration::from_secs(2)),
        ..settings.clone()
    };
    let _ = interleaved(&client, &backend, &name, &warm).await;
    let _ = contended_interleaved(&url, &name, &warm).await;

    let rtt = harness::timed(settings.warmup, settings.run, || async {
        client.check_stat(FLOOR_DIR).await.expect("exists");
    })
    .await;
    rows.push(Row::new(BACKEND, "round trip: exists", &rtt).note(note));

    let (floor, cycles) = interleaved(&client, &backend, &name, settings).await;
    rows.push(
        Row::new(BACKEND, "floor: create(seq. ephemeral) + delete", &floor)
            .note("same session, interleaved with the next row"),
    );
    rows.push(
        Row::new(BACKEND, "uncontended try_acquire+release", &cycles).note(format!(
            "{:.2}x the floor (target >= 0.75x)",
            cycles.per_sec() / floor.per_sec()
        )),
    );

    let (ours, recipe) = contended_interleaved(&url, &name, settings).await;
    let n = settings.contenders;
    rows.push(
        Row::new(
            BACKEND,
            format!("{n}-way contended, adapter (hand-off)"),
            &ours.handoffs,
        )
        .note(format!(
            "FIFO share {:.0}%; {:.2}x the recipe's acquisitions/s (target >= 1x)",
            ours.fifo_share * 100.0,
            ours.handoffs.per_sec() / recipe.handoffs.per_sec().max(1e-9)
        )),
    );
    rows.push(
        Row::new(
            BACKEND,
            format!("{n}-way contended, crate recipe (hand-off)"),
            &recipe.handoffs,
        )
        .note(format!(
            "zookeeper-client Client::lock; FIFO share {:.0}%",
            recipe.fifo_share * 100.0
        )),
    );
    rows
}

/// The adapter and the crate's recipe, each with its own `n` sessions,
/// contending in alternating slices so both see the same machine load.
async fn contended_interleaved(
    url: &str,
    name: &LockName,
    settings: &Settings,
) -> (harness::Contended, harness::Contended) {
    const SLICES: u32 = 6;
    let mut ours = Vec::new();
    let mut recipe = Vec::new();
    for _ in 0..settings.contenders {
        let backend = ZooKeeperBackend::connect_with(config(url))
            .await
            .expect("connect contender");
        ours.push(Arc::new(backend) as Arc<dyn LockBackend>);
        let client = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .expect("connect recipe contender");
        recipe.push(Arc::new(Recipe { client }) as Arc<dyn LockBackend>);
    }
    let recipe_name = LockName::new("recipe").unwrap();
    let slice = settings.run / SLICES;
    let (mut a, mut b) = (harness::Contended::default(), harness::Contended::default());
    for _ in 0..SLICES {
        let x = harness::contended(ours.clone(), name, settings.ttl, slice).await;
        let y = harness::contended(recipe.clone(), &recipe_name, settings.ttl, slice).await;
        for (total, part) in [(&mut a, x), (&mut b, y)] {
            let (before, added) = (total.handoffs.samples.len(), part.handoffs.samples.len());
            let weight = |n: usize| n as f64 / (before + added).max(1) as f64;
            total.fifo_share = total.fifo_share * weight(before) + part.fifo_share * weight(added);
            total.handoffs.elapsed += part.handoffs.elapsed;
            total.handoffs.samples.extend(part.handoffs.samples);
        }
    }
    (a, b)
}

/// The `zookeeper-client` crate's lock recipe, dressed as a backend so the
/// same harness measures it: `acquire` is `Client::lock` (ephemeral
/// sequential node, wait on the predecessor), `release` drops the lock client
/// (which deletes the node). Fences are the node's sequence number (not safe,
/// see the adapter's docs); only the waiting and hand-off are compared.
#[derive(Debug)]
struct Recipe {
    client: zk::Client,
}

type Held = Arc<Mutex<Option<zk::OwnedLockClient>>>;

#[async_trait]
impl LockBackend for Recipe {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("zk-recipe")
            .fairness(Fairness::Fifo)
            .notifications(true)
    }

    async fn try_acquire(&self, _: &LockName, _: Duration) -> Result<Attempt, LockError> {
        Err(unsupported("try_acquire"))
    }

    async fn renew(&self, _: &Lease) -> Result<Lease, LockError> {
        Err(unsupported("renew"))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let held = lease
            .extension::<Held>()
            .and_then(|h| h.lock().unwrap().take());
        Ok(match held {
            // Dropping the lock client deletes its node.
            Some(lock) => {
                drop(lock);
                ReleaseOutcome::Released
            }
            None => ReleaseOutcome::NotHeld,
        })
    }

    async fn inspect(&self, _: &LockName) -> Result<Option<Holder>, LockError> {
        Err(unsupported("inspect"))
    }

    async fn force_release(&self, _: &LockName, _: &str) -> Result<Option<Holder>, LockError> {
        Err(unsupported("force_release"))
    }

    async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let sent = Instant::now();
        let prefix = zk::LockPrefix::new_curator(RECIPE_DIR, "lock-").expect("prefix");
        let options = zk::LockOptions::new(zk::Acls::anyone_all());
        let locked =
            tokio::time::timeout_at(wait.deadline, self.client.lock(prefix, b"", options)).await;
        let lock = match locked {
            Err(_) => return Ok(None),
            Ok(lock) => lock
                .map_err(|e| LockError::unavailable("zk-recipe", e))?
                .into_owned(),
        };
        let seq = lock
            .lock_path()
            .rsplit('-')
            .next()
            .and_then(|s| s.parse::<u64>().ok());
        let fence = FencingToken::new(seq.unwrap_or(0) + 1).expect("non-zero");
        let held: Held = Arc::new(Mutex::new(Some(lock)));
        Ok(Some(
            Lease::new(name.clone(), OwnerToken::new(), fence, ttl, sent).with_extension(held),
        ))
    }
}

fn unsupported(operation: &'static str) -> LockError {
    LockError::Unsupported {
        backend: "zk-recipe",
        operation,
    }
}
