//! Redis: lock cycles (one Lua script round trip to acquire, one to release)
//! next to the raw `SET NX PX` + `DEL` floor on the same kind of connection,
//! measured in the same run against the same server, and N-way contention
//! (waiters in line, each release waking one by pub/sub). `PING` and `SET`
//! round trips are measured too: the hand-off target is stated in round
//! trips. On a server we launched, the contended row also counts the
//! scripts Redis ran per grant: a herd would show as many.

use std::sync::Arc;

use lock_redis::RedisBackend;
use lock_redis::redis::{self as client, aio::ConnectionManager};
use lockcore::{LockBackend, LockName};

use crate::Settings;
use crate::harness::{self, Row, Stats};

const BACKEND: &str = "redis";

async fn floor(con: &ConnectionManager, settings: &Settings) -> Stats {
    let ttl_ms = settings.ttl.as_millis() as u64;
    harness::timed(settings.warmup, settings.run, || {
        let mut con = con.clone();
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
    .await
}

/// Floor and adapter cycles in alternating slices, so load from other
/// processes drifting during the run hits both alike.
async fn interleaved(
    con: &ConnectionManager,
    backend: &RedisBackend,
    name: &LockName,
    settings: &Settings,
) -> (Stats, Stats) {
    const SLICES: u32 = 10;
    let slice = settings.run / SLICES;
    let client: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let (mut floor_stats, mut cycle_stats) = (Stats::default(), Stats::default());
    let quiet = Settings {
        warmup: settings.warmup / SLICES,
        run: slice,
        ..settings.clone()
    };
    for _ in 0..SLICES {
        let f = floor(con, &quiet).await;
        let c = harness::uncontended(client.clone(), name, settings.ttl, quiet.warmup, slice).await;
        for (total, part) in [(&mut floor_stats, f), (&mut cycle_stats, c)] {
            total.elapsed += part.elapsed;
            total.samples.extend(part.samples);
        }
    }
    (floor_stats, cycle_stats)
}

/// One round trip: `PING` (read path), or `SET` (a write, so with
/// `appendfsync always` it includes the fsync every lock operation pays).
async fn round_trip(con: &ConnectionManager, settings: &Settings, write: bool) -> Stats {
    harness::timed(settings.warmup, settings.run / 2, || {
        let mut con = con.clone();
        async move {
            let cmd = if write {
                client::cmd("SET").arg("bench:rtt").arg("x").clone()
            } else {
                client::cmd("PING")
            };
            let _: String = cmd.query_async(&mut con).await.expect("round trip");
        }
    })
    .await
}

fn ms(d: Option<std::time::Duration>) -> f64 {
    d.unwrap_or_default().as_secs_f64() * 1e3
}

/// One field (`calls`, `usec_per_call`, ...) of one command's line in
/// `INFO commandstats`, since the last `CONFIG RESETSTAT`.
async fn command_stat(con: &ConnectionManager, cmd: &str, field: &str) -> Option<String> {
    let info: String = client::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con.clone())
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:")))
        .and_then(|s| {
            s.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
        })
        .map(str::to_string)
}

/// Server-side µs per call of `EVALSHA`, `SET` and `DEL`.
async fn server_usec(con: &ConnectionManager) -> String {
    let mut per_call = Vec::new();
    for cmd in ["evalsha", "set", "del"] {
        let usec = command_stat(con, cmd, "usec_per_call").await;
        per_call.push(usec.unwrap_or_else(|| "?".into()));
    }
    format!(
        "server µs/call: EVALSHA {}, SET {}, DEL {}",
        per_call[0], per_call[1], per_call[2]
    )
}

async fn reset_stats(con: &ConnectionManager) {
    let _: Result<(), _> = client::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con.clone())
        .await;
}

/// Every measurement against the server at `url` (`own`: launched by us, so
/// its statistics may be reset).
async fn measure(url: &str, what: &str, own: bool, settings: &Settings) -> Vec<Row> {
    let backend = RedisBackend::connect(url).await.expect("connect");
    let server = format!("{what}: {}", backend.persistence());
    let mut rows = Vec::new();
    let name = LockName::new("bench/redis").unwrap();

    // The floor runs on the backend's own connection manager: same client,
    // same multiplexing, same server.
    let con = backend.connection();
    let ping = round_trip(&con, settings, false).await;
    rows.push(Row::new(BACKEND, "round trip: PING", &ping).note(server));
    let set = round_trip(&con, settings, true).await;
    rows.push(Row::new(BACKEND, "round trip: SET (a write)", &set));
    if own {
        reset_stats(&con).await;
    }
    let (floor_stats, cycles) = interleaved(&con, &backend, &name, settings).await;
    let usec = if own {
        server_usec(&con).await
    } else {
        "interleaved with the next row".to_string()
    };
    rows.push(Row::new(BACKEND, "floor: SET NX PX + DEL", &floor_stats).note(usec));
    rows.push(
        Row::new(BACKEND, "uncontended acquire+release", &cycles).note(format!(
            "{:.2}x the floor (target >= 0.90x)",
            cycles.per_sec() / floor_stats.per_sec()
        )),
    );

    let mut clients = Vec::new();
    for _ in 0..settings.contenders {
        let backend = RedisBackend::connect(url).await.expect("connect contender");
        clients.push(Arc::new(backend) as Arc<dyn LockBackend>);
    }
    if own {
        reset_stats(&con).await;
    }
    let contended = harness::contended(clients, &name, settings.ttl, settings.run).await;
    let scripts = match command_stat(&con, "evalsha", "calls").await {
        Some(calls) if own => {
            let calls: f64 = calls.parse().unwrap_or(f64::NAN);
            let grants = contended.handoffs.samples.len().max(1) as f64;
            format!("; {:.1} scripts per grant", calls / grants)
        }
        _ => String::new(),
    };
    let p99 = ms(contended.handoffs.percentile(0.99));
    rows.push(
        Row::new(
            BACKEND,
            format!("{}-way contended (hand-off)", settings.contenders),
            &contended.handoffs,
        )
        .note(format!(
            "p99 = {:.1}x PING p50, {:.1}x SET p50 (target <= 5); FIFO share {:.0}%{scripts}",
            p99 / ms(ping.percentile(0.50)).max(1e-9),
            p99 / ms(set.percentile(0.50)).max(1e-9),
            contended.fifo_share * 100.0
        )),
    );
    rows
}

pub async fn run(settings: &Settings) -> Vec<Row> {
    use lock_conformance::stores::redis::{self as stores, Options, Persistence};
    let store = stores::shared();
    let label = if store.is_external() {
        "external server"
    } else {
        "launched server"
    };
    let mut rows = measure(&store.url(), label, !store.is_external(), settings).await;
    // Without persistence (not a recommended setting: fences then rely on
    // the server clock): the adapter's own cost, without fsync.
    match stores::start(Options::default().persistence(Persistence::None)) {
        Ok(fast) => rows.extend(measure(&fast.url(), "reference only", true, settings).await),
        Err(e) => eprintln!("redis without persistence not measured: {e}"),
    }
    rows
}
