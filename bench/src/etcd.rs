//! etcd: lock cycles next to the raw put+delete floor (same client library,
//! same kind of connection), interleaved in slices within one run; then
//! N-way contention two ways, also interleaved: the adapter's FIFO queue
//! (waiters follow the queue's deletes on one long-lived watch stream per
//! client) and etcd's own Lock RPC (v3lock, the server-side
//! `concurrency.Mutex`).

use std::sync::Arc;
use std::time::Duration;

use lock_etcd::etcd_client::{self, Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockBackend, LockError, LockName,
    OwnerToken, ReleaseOutcome, WaitPolicy, async_trait,
};
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Contended, Row, Stats};

const BACKEND: &str = "etcd";
const FLOOR_KEY: &str = "bench/etcd-floor";
const TXN_QUEUE: &str = "bench/etcd-txn-floor/";
/// A 32-character value, like an owner token.
const TXN_VALUE: &str = "0123456789abcdef0123456789abcdef";

/// One put and one delete of one key, back to back.
async fn floor_cycle(raw: &etcd_client::Client) {
    let mut kv = raw.kv_client();
    kv.put(FLOOR_KEY, "x", None).await.expect("put");
    kv.delete(FLOOR_KEY, None).await.expect("delete");
}

/// What an uncontended lock cycle sends, without the library: a `Txn` that
/// puts a key attached to a lease if its queue is empty, and a `Txn` that
/// deletes it if its create revision and value still match. etcd cannot do
/// either atomically with a plain put or delete.
async fn txn_cycle(raw: &etcd_client::Client, lease: i64) {
    let mut kv = raw.kv_client();
    let key = format!("{TXN_QUEUE}k");
    let end = "bench/etcd-txn-floor0"; // the queue's range: '/' + 1 == '0'
    let put = Txn::new()
        .when([Compare::create_revision(TXN_QUEUE, CompareOp::Equal, 0).with_range(end)])
        .and_then([TxnOp::put(
            key.clone(),
            TXN_VALUE,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let reply = kv.txn(put).await.expect("put txn");
    assert!(reply.succeeded(), "the txn floor's key was left behind");
    let revision = reply.header().expect("header").revision();
    let delete = Txn::new()
        .when([
            Compare::create_revision(key.clone(), CompareOp::Equal, revision),
            Compare::value(key.clone(), CompareOp::Equal, TXN_VALUE),
        ])
        .and_then([TxnOp::delete(key, None)]);
    assert!(kv.txn(delete).await.expect("delete txn").succeeded());
}

fn add(total: &mut Stats, part: Stats) {
    total.elapsed += part.elapsed;
    total.samples.extend(part.samples);
}

/// The two floors and the adapter's cycles in alternating slices, so load
/// from other processes drifting during the run hits all alike.
async fn interleaved(
    raw: &etcd_client::Client,
    backend: &EtcdBackend,
    name: &LockName,
    settings: &Settings,
) -> [Stats; 3] {
    const SLICES: u32 = 10;
    let slice = settings.run / SLICES;
    let warmup = settings.warmup / SLICES;
    let lock: Arc<dyn LockBackend> = Arc::new(backend.clone());
    let lease = raw
        .lease_client()
        .grant(600, None)
        .await
        .expect("lease for the txn floor")
        .id();
    let mut totals: [Stats; 3] = Default::default();
    for _ in 0..SLICES {
        add(
            &mut totals[0],
            harness::timed(warmup, slice, || floor_cycle(raw)).await,
        );
        add(
            &mut totals[1],
            harness::timed(warmup, slice, || txn_cycle(raw, lease)).await,
        );
        add(
            &mut totals[2],
            harness::uncontended(lock.clone(), name, settings.ttl, warmup, slice).await,
        );
    }
    let _ = raw.lease_client().revoke(lease).await;
    totals
}

/// The adapter and the Lock RPC, each with its own `n` clients, contending
/// in alternating slices so both see the same machine load.
async fn contended_interleaved(
    url: &str,
    name: &LockName,
    settings: &Settings,
) -> (Contended, Contended) {
    const SLICES: u32 = 6;
    let mut ours = Vec::new();
    let mut rpc = Vec::new();
    for _ in 0..settings.contenders {
        let backend = EtcdBackend::connect_with(EtcdConfig::new([url]))
            .await
            .expect("connect contender");
        ours.push(Arc::new(backend) as Arc<dyn LockBackend>);
        rpc.push(Arc::new(LockRpc::connect(url).await) as Arc<dyn LockBackend>);
    }
    let rpc_name = LockName::new("bench/etcd-lock-rpc").unwrap();
    let slice = settings.run / SLICES;
    let (mut a, mut b) = (Contended::default(), Contended::default());
    for _ in 0..SLICES {
        let x = harness::contended(ours.clone(), name, settings.ttl, slice).await;
        let y = harness::contended(rpc.clone(), &rpc_name, settings.ttl, slice).await;
        for (total, part) in [(&mut a, x), (&mut b, y)] {
            let (before, added) = (total.handoffs.samples.len(), part.handoffs.samples.len());
            let weight = |n: usize| n as f64 / (before + added).max(1) as f64;
            total.fifo_share = total.fifo_share * weight(before) + part.fifo_share * weight(added);
            add(&mut total.handoffs, part.handoffs);
        }
    }
    (a, b)
}

pub async fn run(settings: &Settings) -> Vec<Row> {
    let store = lock_conformance::stores::etcd::shared();
    let url = store.url();
    let note = if store.is_external() {
        format!("server {}", store.addr())
    } else {
        "launched single member, default fsync".to_string()
    };
    let raw = etcd_client::Client::connect([url.as_str()], None)
        .await
        .expect("connect floor");
    let backend = EtcdBackend::connect_with(EtcdConfig::new([url.clone()]))
        .await
        .expect("connect");
    let name = LockName::new("bench/etcd").unwrap();
    let mut rows = Vec::new();

    // Warm up connections, leases and etcd itself with every kind of
    // request measured below.
    let warm = Settings {
        warmup: Duration::ZERO,
        run: settings.warmup.max(Duration::from_secs(1)),
        ..settings.clone()
    };
    let _ = interleaved(&raw, &backend, &name, &warm).await;

    let [floor, txn_floor, cycles] = interleaved(&raw, &backend, &name, settings).await;
    rows.push(
        Row::new(BACKEND, "floor: put + delete (one key)", &floor)
            .note(format!("{note}; interleaved with the next two rows")),
    );
    rows.push(
        Row::new(
            BACKEND,
            "floor: the cycle's two Txns, raw client",
            &txn_floor,
        )
        .note(format!(
            "{:.2}x the put+delete floor: etcd's price of compare-and-set",
            txn_floor.per_sec() / floor.per_sec()
        )),
    );
    rows.push(
        Row::new(BACKEND, "uncontended try_acquire+release", &cycles).note(format!(
            "{:.2}x the put+delete floor (target >= 0.9x), {:.2}x the raw Txns",
            cycles.per_sec() / floor.per_sec(),
            cycles.per_sec() / txn_floor.per_sec()
        )),
    );

    let _ = contended_interleaved(&url, &name, &warm).await;
    let (queued, server) = contended_interleaved(&url, &name, settings).await;
    let n = settings.contenders;
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
        .note(format!(
            "FIFO share {:.0}%; interleaved with the row above",
            server.fifo_share * 100.0
        )),
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
