//! etcd: lock cycles next to the raw put+delete floor measured in the same
//! run, then N-way contention two ways: the adapter's FIFO queue (waiters
//! watch their predecessor from "now", fast path) and etcd's own Lock RPC
//! (v3lock, the server-side `concurrency.Mutex`).

use std::sync::Arc;
use std::time::Duration;

use lock_etcd::etcd_client::{self, LockOptions};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    OwnerToken, ReleaseOutcome, WaitPolicy, async_trait,
};
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Row};

const BACKEND: &str = "etcd";

pub async fn run(settings: &Settings) -> Vec<Row> {
    let store = lock_conformance::stores::etcd::shared();
    let url = store.url();
    let note = if store.is_external() {
        format!("server {}", store.addr())
    } else {
        "launched single member, default fsync".to_string()
    };
    let mut rows = Vec::new();

    // Floor: the same client library and connection kind, one key, put then delete.
    let raw = etcd_client::Client::connect([url.as_str()], None)
        .await
        .expect("connect floor");
    let floor_run = || async {
        harness::timed(settings.warmup, settings.run, || {
            let mut kv = raw.kv_client();
            async move {
                kv.put("bench/etcd-floor", "x", None).await.expect("put");
                kv.delete("bench/etcd-floor", None).await.expect("delete");
            }
        })
        .await
    };

    let connect = || EtcdBackend::connect_with(EtcdConfig::new([url.clone()]));
    let backend = connect().await.expect("connect");
    let name = LockName::new("bench/etcd").unwrap();
    let client: Arc<dyn LockBackend> = Arc::new(backend.clone());
    // Floor before and after the lock cycles, pooled: on a shared machine
    // the load drifts, and a floor from another moment is no floor.
    let before = floor_run().await;
    let cycles =
        harness::uncontended(client, &name, settings.ttl, settings.warmup, settings.run).await;
    let after = floor_run().await;
    let floor = harness::Stats {
        elapsed: before.elapsed + after.elapsed,
        samples: [before.samples, after.samples].concat(),
    };
    rows.push(Row::new(BACKEND, "floor: put + delete (one key)", &floor).note(note));
    rows.push(
        Row::new(BACKEND, "uncontended try_acquire+release", &cycles).note(format!(
            "{:.2}x the put+delete floor (target >= 0.9x)",
            cycles.per_sec() / floor.per_sec()
        )),
    );

    let n = settings.contenders;
    let mut ours = Vec::new();
    let mut rpc = Vec::new();
    for _ in 0..n {
        ours.push(Arc::new(connect().await.expect("connect contender")) as Arc<dyn LockBackend>);
        rpc.push(Arc::new(LockRpc::connect(&url).await) as Arc<dyn LockBackend>);
    }
    let queued = harness::contended(ours, &name, settings.ttl, settings.run).await;
    let rpc_name = LockName::new("bench/etcd-lock-rpc").unwrap();
    let server = harness::contended(rpc, &rpc_name, settings.ttl, settings.run).await;
    let speedup = queued.handoffs.per_sec() / server.handoffs.per_sec().max(1e-9);
    let p99_ok = queued
        .handoffs
        .percentile(0.99)
        .is_some_and(|p| p < Duration::from_millis(5));
    rows.push(
        Row::new(
            BACKEND,
            format!("{n}-way contended, FIFO queue"),
            &queued.handoffs,
        )
        .note(format!(
            "FIFO share {:.0}%, {speedup:.1}x the Lock RPC (target >= 5x), p99 {} 5 ms",
            queued.fifo_share * 100.0,
            if p99_ok { "<" } else { ">=" }
        )),
    );
    rows.push(
        Row::new(
            BACKEND,
            format!("{n}-way contended, etcd Lock RPC"),
            &server.handoffs,
        )
        .note(format!("FIFO share {:.0}%", server.fifo_share * 100.0)),
    );
    rows
}

/// etcd's built-in Lock RPC as a backend, for the contended comparison only:
/// one client with its own lease (kept alive for the run by its 60 s TTL).
struct LockRpc {
    client: etcd_client::Client,
    lease: i64,
}

impl std::fmt::Debug for LockRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRpc")
            .field("lease", &self.lease)
            .finish()
    }
}

impl LockRpc {
    async fn connect(url: &str) -> Self {
        let mut client = etcd_client::Client::connect([url], None)
            .await
            .expect("connect lock rpc contender");
        let lease = client.lease_grant(60, None).await.expect("lease").id();
        LockRpc { client, lease }
    }
}

fn unsupported(operation: &'static str) -> LockError {
    LockError::Unsupported {
        backend: "etcd-lock-rpc",
        operation,
    }
}

#[async_trait]
impl LockBackend for LockRpc {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("etcd-lock-rpc").notifications(true)
    }

    async fn try_acquire(&self, _: &LockName, _: Duration) -> Result<Attempt, LockError> {
        Err(unsupported("try_acquire"))
    }

    async fn renew(&self, _: &Lease) -> Result<Lease, LockError> {
        Err(unsupported("renew"))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let key = lease
            .extension::<Vec<u8>>()
            .cloned()
            .ok_or(LockError::NotHeld {
                name: lease.name().clone(),
            })?;
        let mut client = self.client.clone();
        client
            .unlock(key)
            .await
            .map_err(|e| LockError::unavailable("etcd-lock-rpc", e))?;
        Ok(ReleaseOutcome::Released)
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
        let mut client = self.client.clone();
        let sent = Instant::now();
        let options = LockOptions::new().with_lease(self.lease);
        let reply =
            match tokio::time::timeout_at(wait.deadline, client.lock(name.as_str(), Some(options)))
                .await
            {
                Ok(reply) => reply.map_err(|e| LockError::unavailable("etcd-lock-rpc", e))?,
                Err(_) => return Ok(None),
            };
        let revision = reply.header().map_or(1, |h| h.revision());
        let fence = FencingToken::new(u64::try_from(revision).unwrap_or(1).max(1)).unwrap();
        Ok(Some(
            Lease::new(name.clone(), OwnerToken::new(), fence, ttl, sent)
                .with_extension(reply.key().to_vec()),
        ))
    }
}
