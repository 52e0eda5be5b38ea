//! `cargo run --release -p distlock-bench --all-features -- [BACKEND...]`
//!
//! Prints, per backend: uncontended acquire+release cycles/s next to the
//! store's raw floor measured in the same run (the physical limit: one round
//! trip to acquire, one to release), and N-way contended acquisitions/s with
//! hand-off p50/p99. Stores are launched by the conformance harness unless a
//! `LOCK_TEST_*` variable points at one.

#[cfg(feature = "etcd")]
mod etcd;
mod harness;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "zookeeper")]
mod zookeeper;

use std::time::Duration;

/// Run lengths and load, from the environment (`BENCH_SECS`, `BENCH_CONTENDERS`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub warmup: Duration,
    pub run: Duration,
    pub contenders: usize,
    pub ttl: Duration,
}

fn settings() -> Settings {
    let secs = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0_f64);
    Settings {
        warmup: Duration::from_secs_f64(secs / 3.0),
        run: Duration::from_secs_f64(secs),
        contenders: std::env::var("BENCH_CONTENDERS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(16),
        ttl: Duration::from_secs(10),
    }
}

#[tokio::main]
async fn main() {
    let settings = settings();
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let wants = |b: &str| wanted.is_empty() || wanted.iter().any(|w| w == b);
    let mut rows = Vec::new();
    if wants("memory") {
        rows.extend(memory::run(&settings).await);
    }
    #[cfg(feature = "sqlite")]
    if wants("sqlite") {
        rows.extend(sqlite::run(&settings).await);
    }
    #[cfg(feature = "redis")]
    if wants("redis") {
        rows.extend(redis::run(&settings).await);
    }
    #[cfg(feature = "postgres")]
    if wants("postgres") {
        rows.extend(postgres::run(&settings).await);
    }
    #[cfg(feature = "etcd")]
    if wants("etcd") {
        rows.extend(etcd::run(&settings).await);
    }
    #[cfg(feature = "zookeeper")]
    if wants("zookeeper") {
        rows.extend(zookeeper::run(&settings).await);
    }
    harness::print(&rows);
}
