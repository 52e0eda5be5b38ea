//! Redis: lock cycles (one Lua script round trip to acquire, one to release)
//! next to the raw `SET NX PX` + `DEL` floor and the `rslock` crate
//! (Redlock on this one node: `SET NX PX` to lock, a compare-and-delete
//! script to unlock, retrying with random sleeps when held), against the
//! same server; then the same without persistence. Scale scenarios run on
//! the durable server, counted with `INFO commandstats`.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lock_redis::RedisBackend;
use lock_redis::redis::{self as client, aio::ConnectionManager};
use lockcore::LockBackend;
use lockcore::backend::async_trait;
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Client, Held, Shared, op};
use crate::lineup::{self, Lineup};
use crate::report::{Report, Verdict};
use crate::scale::{self, Pool, Probe};

pub(crate) async fn run(settings: Settings) -> Report {
    use lock_conformance::kit::stores::redis::{self as stores, Options, Persistence};
    let store = stores::shared();
    let own = !store.is_external();
    let mut report = server("redis", &store.url(), own, &settings).await;
    if own {
        let probe = Server::connect(&store.url(), store.pid()).await;
        let url = store.url();
        report.extend(
            scale::run(
                "redis",
                || {
                    let url = url.clone();
                    async move {
                        Arc::new(RedisBackend::connect(&url).await.expect("connect"))
                            as Arc<dyn LockBackend>
                    }
                    .boxed()
                },
                &probe,
                Pool {
                    size: 2,
                    what: "1 multiplexed command connection + 1 pub/sub".into(),
                },
                &settings,
            )
            .await,
        );
    } else {
        report.verdict(Verdict::new(
            "redis",
            "scale scenarios",
            "not run against an external server (its counters are not ours to reset)",
            None,
        ));
    }
    // Without persistence (not a recommended setting: fences then rely on
    // the server clock): what the adapter costs without fsync.
    match stores::start(Options::default().persistence(Persistence::None)) {
        Ok(fast) => {
            report.extend(server("redis, no persistence", &fast.url(), true, &settings).await)
        }
        Err(e) => report
            .failures
            .push(format!("redis without persistence not measured: {e}")),
    }
    // The lossless mode: a replica, and each grant and renewal counts only
    // once it has it (`WAIT 1` in the same request).
    match replicated().await {
        Ok((primary, _replica)) => {
            let url = format!("{}?wait_replicas=1", primary.url());
            report.extend(server("redis + replica, wait_replicas=1", &url, true, &settings).await)
        }
        Err(e) => report
            .failures
            .push(format!("redis with wait_replicas not measured: {e}")),
    }
    report
}

/// A durable primary and its replica, once the replica has its first copy.
async fn replicated() -> std::io::Result<(
    lock_conformance::kit::stores::Store,
    lock_conformance::kit::stores::Store,
)> {
    use lock_conformance::kit::stores::redis::{self as stores, Options};
    // The replica gets its first copy at once (no diskless-sync delay).
    let primary =
        stores::start(Options::durable().server_args(["--repl-diskless-sync-delay", "0"]))?;
    let replica = stores::start_replica(primary.addr(), Options::durable())?;
    let probe = Server::connect(&replica.url(), None).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.field("replication", "master_link_status").await != "up" {
        if Instant::now() > deadline {
            return Err(std::io::Error::other(
                "the replica did not sync within 30 s",
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((primary, replica))
}

/// Every row against the server at `url` (`own`: launched here, so its
/// statistics may be reset).
async fn server(label: &str, url: &str, own: bool, settings: &Settings) -> Report {
    let backend = RedisBackend::connect(url).await.expect("connect");
    // The floor and round trips run on the backend's own connection: same
    // client, same multiplexing, same server.
    let con = backend.client();
    let info = Server {
        con: con.clone(),
        pid: None,
    };
    let version = info.field("server", "redis_version").await;
    let persistence = backend.persistence().to_string();
    let ping = harness::timed(&command(&con, &["PING"]), settings.warmup, settings.run / 2).await;

    let ttl_ms = settings.ttl.as_millis().to_string();
    let floor = {
        let con = con.clone();
        op(move || {
            let (mut con, ttl_ms) = (con.clone(), ttl_ms.clone());
            async move {
                let set: Option<String> = client::cmd("SET")
                    .arg("bench:floor")
                    .arg("owner")
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async(&mut con)
                    .await
                    .expect("SET NX PX");
                assert!(set.is_some(), "the floor key must be free");
                let _: i64 = client::cmd("DEL")
                    .arg("bench:floor")
                    .query_async(&mut con)
                    .await
                    .expect("DEL");
            }
        })
    };
    let rslock = Redlock::shared(url, "bench:rslock", settings.ttl);
    let mut contenders: Vec<Arc<dyn LockBackend>> = Vec::new();
    let mut peers: Vec<Shared> = Vec::new();
    for _ in 0..settings.contenders {
        let backend = RedisBackend::connect(url).await.expect("connect contender");
        contenders.push(Arc::new(backend));
        peers.push(Redlock::shared(url, "bench:rslock-contended", settings.ttl));
    }
    if own {
        reset_stats(&con).await;
    }
    let lineup = Lineup {
        backend: label.into(),
        round_trip: Some(("PING".into(), ping)),
        floor: Some(("SET NX PX + DEL".into(), floor)),
        other_floors: vec![(
            "SET (one write)".into(),
            command(&con, &["SET", "bench:rtt", "x"]),
        )],
        peers: vec![("rslock lock + unlock".into(), harness::cycle(rslock))],
        contended_peers: vec![("rslock (Redlock, 1 node, default retries)".into(), peers)],
        backend_instance: Arc::new(backend),
        contenders,
        floor_target: Some(0.9),
    };
    let mut report = lineup::measure(lineup, settings).await;
    if own {
        // Server time per call over the rows above: what a script costs
        // the server next to a bare command.
        let mut per_call = Vec::new();
        for cmd in ["evalsha", "set", "del"] {
            let usec = info.command_stat(cmd, "usec_per_call").await;
            per_call.push(format!(
                "{} {} µs",
                cmd.to_uppercase(),
                usec.unwrap_or_else(|| "?".into())
            ));
        }
        if let Some(row) = report.rows.iter_mut().find(|r| r.what == "SET NX PX + DEL") {
            row.note = format!(
                "{}; server time per call over this server's rows: {}",
                row.note,
                per_call.join(", ")
            );
        }
    }
    report.store(label, format!("Redis {version}"), persistence);
    report
}

/// One command, as a timed operation.
fn command(con: &ConnectionManager, args: &[&str]) -> harness::Op {
    let con = con.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    op(move || {
        let mut con = con.clone();
        let mut cmd = client::cmd(&args[0]);
        for a in &args[1..] {
            cmd.arg(a);
        }
        async move {
            let _: client::Value = cmd.query_async(&mut con).await.expect("command");
        }
    })
}

async fn reset_stats(con: &ConnectionManager) {
    let _: Result<(), _> = client::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con.clone())
        .await;
}

/// A Redis server's own counters.
struct Server {
    con: ConnectionManager,
    pid: Option<u32>,
}

/// Commands a client sends that a script cannot: each one a request from
/// outside (commands run by scripts are counted under their own names).
const TOP_LEVEL: &[&str] = &[
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "fcall_ro",
    "multi",
    "exec",
    "ping",
    "subscribe",
    "unsubscribe",
    "psubscribe",
    "punsubscribe",
    "script|load",
    "script|exists",
];

impl Server {
    /// A connection of its own, so the probe's commands are not the backend's.
    async fn connect(url: &str, pid: Option<u32>) -> Self {
        let client = client::Client::open(url).expect("redis url");
        let con = ConnectionManager::new(client)
            .await
            .expect("probe connection");
        Server { con, pid }
    }

    async fn info(&self, section: &str) -> String {
        client::cmd("INFO")
            .arg(section)
            .query_async(&mut self.con.clone())
            .await
            .unwrap_or_default()
    }

    async fn field(&self, section: &str, field: &str) -> String {
        self.info(section)
            .await
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or("?")
            .trim()
            .to_string()
    }

    /// One field (`calls`, `usec_per_call`) of one command's `INFO commandstats` line.
    async fn command_stat(&self, cmd: &str, field: &str) -> Option<String> {
        stat_of(&self.info("commandstats").await, cmd, field)
    }
}

fn stat_of(info: &str, cmd: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:")))
        .and_then(|s| {
            s.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
        })
        .map(str::to_string)
}

#[async_trait]
impl Probe for Server {
    fn unit(&self) -> &'static str {
        "commands (INFO commandstats: scripts, PING, pub/sub)"
    }
    async fn requests(&self) -> Option<u64> {
        let info = self.info("commandstats").await;
        if info.is_empty() {
            return None;
        }
        Some(
            TOP_LEVEL
                .iter()
                .filter_map(|c| stat_of(&info, c, "calls")?.parse::<u64>().ok())
                .sum(),
        )
    }
    async fn connections(&self) -> Option<u64> {
        self.field("clients", "connected_clients")
            .await
            .parse()
            .ok()
    }
    fn pid(&self) -> Option<u32> {
        self.pid
    }
}

/// The `rslock` crate on one node, with its defaults (3 tries, random
/// sleeps up to 200 ms between them, then `acquire` tries again forever).
struct Redlock {
    manager: rslock::LockManager,
    resource: String,
    ttl: Duration,
}

impl Redlock {
    fn shared(url: &str, resource: &str, ttl: Duration) -> Shared {
        Arc::new(Redlock {
            manager: rslock::LockManager::new(vec![url.to_string()]),
            resource: resource.to_string(),
            ttl,
        })
    }
}

#[async_trait]
impl Client for Redlock {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let lock = tokio::time::timeout_at(
            deadline,
            self.manager
                .acquire_no_guard(self.resource.as_str(), self.ttl),
        )
        .await
        .ok()?
        .expect("rslock acquire");
        Some(Box::new(lock))
    }

    async fn release(&self, held: Held) {
        let lock = held.downcast::<rslock::Lock>().expect("an rslock lock");
        self.manager.unlock(&lock).await;
    }
}
