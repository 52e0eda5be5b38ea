//! ZooKeeper: lock cycles next to the raw create+delete floor (an ephemeral
//! sequential node, the same kind of node the recipe creates) on the same
//! session, interleaved in many short rounds of the same run; then N-way
//! contention two ways: the adapter's queue and the `zookeeper-client`
//! crate's own lock recipe (Curator-compatible `Client::lock`). The JVM is
//! warmed up first.
//!
//! Every write waits for the server's fsync, whose latency swings with the
//! disk load of everything else on the machine, far more than the adapter's
//! own cost. So the uncontended kinds take turns in blocks of a few cycles
//! (order flipped every round); the ratio is reported over the whole run,
//! with its spread over the tenths of the run, and next to it the CPU time
//! per cycle of this process and of the server, which fsync latency does not
//! move.

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

fn ephemeral_sequential() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

/// One create (ephemeral sequential) and one delete, back to back.
async fn floor_cycle(client: &zk::Client) {
    let (_, seq) = client
        .create(&format!("{FLOOR_DIR}/n-"), b"", &ephemeral_sequential())
        .await
        .expect("create");
    client
        .delete(&format!("{FLOOR_DIR}/n-{seq}"), None)
        .await
        .expect("delete");
}

/// The floor plus a listing of the parent sent right behind the create, as
/// a queue recipe that reads the queue on every acquisition does: what that
/// read costs.
async fn listing_cycle(client: &zk::Client) {
    let prefix = format!("{FLOOR_DIR}/n-");
    let create = client.create(&prefix, b"", &ephemeral_sequential());
    let list = client.list_children(FLOOR_DIR);
    let (_, seq) = create.await.expect("create");
    list.await.expect("list");
    client
        .delete(&format!("{FLOOR_DIR}/n-{seq}"), None)
        .await
        .expect("delete");
}

/// CPU time (user + system) used so far by every thread of process `pid`
/// (this one if `None`), from `/proc/<pid>/task/*/schedstat`; 0 where that
/// cannot be read.
fn cpu_time(pid: Option<u32>) -> Duration {
    let dir = pid.map_or("/proc/self/task".to_string(), |p| format!("/proc/{p}/task"));
    let nanos: u64 = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// One kind of uncontended cycle, summed over the rounds.
#[derive(Default)]
struct Kind {
    stats: Stats,
    /// The cycles of each round.
    rounds: Vec<Stats>,
    client_cpu: Duration,
    server_cpu: Duration,
}

impl Kind {
    fn add(&mut self, part: Stats, cpu: (Duration, Duration)) {
        self.stats.elapsed += part.elapsed;
        self.stats.samples.extend(part.samples.iter().copied());
        self.rounds.push(part);
        self.client_cpu += cpu.0;
        self.server_cpu += cpu.1;
    }

    fn per_cycle(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / self.stats.samples.len().max(1) as f64
    }

    fn mean_us(&self) -> f64 {
        self.stats.elapsed.as_secs_f64() * 1e6 / self.stats.samples.len().max(1) as f64
    }

    /// Cycles/s over the floor's, in each tenth of the run.
    fn tenths(&self, floor: &Kind) -> Vec<f64> {
        let per_tenth = self.rounds.len().div_ceil(10).max(1);
        let rate = |rounds: &[Stats]| {
            let cycles: usize = rounds.iter().map(|r| r.samples.len()).sum();
            let took: Duration = rounds.iter().map(|r| r.elapsed).sum();
            cycles as f64 / took.as_secs_f64().max(1e-9)
        };
        self.rounds
            .chunks(per_tenth)
            .zip(floor.rounds.chunks(per_tenth))
            .map(|(ours, floor)| rate(ours) / rate(floor))
            .collect()
    }

    /// "0.97x the floor{target} (tenths of the run: min 0.90 / median 0.97 /
    /// max 1.05); +25 us per cycle; CPU/cycle client 150 us, server 500 us"
    fn versus(&self, floor: &Kind, target: &str) -> String {
        let mut tenths = self.tenths(floor);
        tenths.sort_by(f64::total_cmp);
        format!(
            "{:.2}x the floor{target} (tenths of the run: min {:.2} / median {:.2} / max {:.2}); {:+.0} us per cycle; CPU/cycle client {:.0} us, server {:.0} us",
            self.stats.per_sec() / floor.stats.per_sec(),
            tenths.first().copied().unwrap_or(f64::NAN),
            tenths.get(tenths.len() / 2).copied().unwrap_or(f64::NAN),
            tenths.last().copied().unwrap_or(f64::NAN),
            self.mean_us() - floor.mean_us(),
            self.per_cycle(self.client_cpu),
            self.per_cycle(self.server_cpu),
        )
    }
}

/// The floor, the floor with a listing, and the adapter's cycles, taking
/// turns in blocks of a few cycles (the order flips every round), so the
/// fsync stalls and the load of other processes hit all alike. Each block's
/// CPU time is read outside the timed cycles.
async fn interleaved(
    client: &zk::Client,
    backend: &ZooKeeperBackend,
    name: &LockName,
    server: Option<u32>,
    settings: &Settings,
    run: Duration,
) -> [Kind; 3] {
    const BLOCK: usize = 8;
    let lock: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let mut kinds: [Kind; 3] = Default::default();
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < run {
        let order: [usize; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        round += 1;
        for k in order {
            let before = (cpu_time(None), cpu_time(server));
            let mut part = Stats::default();
            for _ in 0..BLOCK {
                let t = Instant::now();
                match k {
                    0 => floor_cycle(client).await,
                    1 => listing_cycle(client).await,
                    _ => {
                        let lease = lock
                            .try_acquire(name, settings.ttl)
                            .await
                            .expect("acquire")
                            .into_lease()
                            .expect("uncontended lock must be free");
                        lock.release(&lease).await.expect("release");
                    }
                }
                let took = t.elapsed();
                part.elapsed += took;
                part.samples.push(took);
            }
            let cpu = (cpu_time(None) - before.0, cpu_time(server) - before.1);
            kinds[k].add(part, cpu);
        }
    }
    kinds
}

pub async fn run(settings: &Settings) -> Vec<Row> {
    let store = lock_conformance::stores::zookeeper::shared();
    let url = store.url();
    let server = store.pid();
    let note = if store.is_external() {
        format!("server {} (its CPU not measured)", store.addr())
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

    // Warm the JVM (JIT, caches) with every kind of request measured below:
    // its compiler threads keep busy for several seconds after start.
    let warm = settings.warmup.max(Duration::from_secs(3));
    let _ = interleaved(&client, &backend, &name, server, settings, warm).await;
    let _ = contended_interleaved(
        &url,
        &name,
        &Settings {
            warmup: Duration::ZERO,
            run: warm,
            ..settings.clone()
        },
    )
    .await;

    let rtt = harness::timed(settings.warmup, settings.run, || async {
        client.check_stat(FLOOR_DIR).await.expect("exists");
    })
    .await;
    rows.push(Row::new(BACKEND, "round trip: exists", &rtt).note(note));

    let [floor, listing, cycles] =
        interleaved(&client, &backend, &name, server, settings, settings.run).await;
    rows.push(
        Row::new(BACKEND, "floor: create(seq. ephemeral) + delete", &floor.stats).note(format!(
            "same session, interleaved with the next rows; CPU/cycle client {:.0} us, server {:.0} us",
            floor.per_cycle(floor.client_cpu),
            floor.per_cycle(floor.server_cpu)
        )),
    );
    rows.push(
        Row::new(
            BACKEND,
            "floor + pipelined children listing",
            &listing.stats,
        )
        .note(listing.versus(&floor, "")),
    );
    rows.push(
        Row::new(BACKEND, "uncontended try_acquire+release", &cycles.stats)
            .note(cycles.versus(&floor, ", target >= 0.75x")),
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

    async fn evict(
        &self,
        _: &LockName,
        _: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        Err(unsupported("evict"))
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
