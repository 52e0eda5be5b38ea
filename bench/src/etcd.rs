//! etcd: lock cycles next to etcd's floor, the two compare-and-set `Txn`s
//! a lock cycle cannot do without (put a key attached to a lease if the
//! queue is empty; delete it if its revision and value still match), sent
//! with the raw client; a bare put + delete; and etcd's own Lock RPC (v3lock,
//! the server-side `concurrency.Mutex`), uncontended and contended. Scale
//! scenarios count the gRPC messages the server received (its `/metrics`)
//! and its TCP connections.
//!
//! Built only with the `etcd` feature (the adapter's migration to the new
//! lockcore API lands separately).

use std::sync::Arc;

use futures::FutureExt;
use lock_etcd::etcd_client::{self, Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::LockBackend;
use lockcore::backend::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::Settings;
use crate::harness::{self, Client, Held, Shared, op};
use crate::lineup::{self, Lineup};
use crate::report::Report;
use crate::scale::{self, Pool, Probe};

const BACKEND: &str = "etcd";
const FLOOR_KEY: &str = "bench/etcd-floor";
const TXN_QUEUE: &str = "bench/etcd-txn-floor/";
/// A 32-character value, like an owner token.
const TXN_VALUE: &str = "0123456789abcdef0123456789abcdef";

/// One put and one delete of one key, back to back.
async fn put_delete(raw: etcd_client::Client) {
    let mut kv = raw.kv_client();
    kv.put(FLOOR_KEY, "x", None).await.expect("put");
    kv.delete(FLOOR_KEY, None).await.expect("delete");
}

/// What an uncontended lock cycle sends, without the library: a `Txn` that
/// puts a key attached to a lease if its queue is empty, and a `Txn` that
/// deletes it if its create revision and value still match.
async fn txn_cycle(raw: etcd_client::Client, lease: i64) {
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

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        EtcdBackend::connect_with(EtcdConfig::new([url]))
            .await
            .expect("connect"),
    )
}

pub(crate) async fn run(settings: Settings) -> Report {
    let store = lock_conformance::kit::stores::etcd::shared();
    let url = store.endpoint();
    let raw = etcd_client::Client::connect([url.as_str()], None)
        .await
        .expect("connect floor");
    let version = raw
        .clone()
        .status()
        .await
        .map(|s| s.version().to_string())
        .unwrap_or_else(|_| "?".into());
    let rtt = {
        let raw = raw.clone();
        op(move || {
            let mut kv = raw.kv_client();
            async move {
                kv.get(FLOOR_KEY, None).await.expect("get");
            }
        })
    };
    let round_trip = harness::timed(&rtt, settings.warmup, settings.run / 2).await;
    let lease = raw
        .lease_client()
        .grant(600, None)
        .await
        .expect("lease for the txn floor")
        .id();
    let txns = {
        let raw = raw.clone();
        op(move || txn_cycle(raw.clone(), lease))
    };
    let plain = {
        let raw = raw.clone();
        op(move || put_delete(raw.clone()))
    };
    let mut contenders = Vec::new();
    let mut rpc = Vec::new();
    for _ in 0..settings.contenders {
        contenders.push(connect(&url).await);
        rpc.push(LockRpc::connect(&url, "bench/etcd-lock-rpc-contended").await);
    }
    let lineup = Lineup {
        backend: BACKEND.into(),
        round_trip: Some(("get (one key)".into(), round_trip)),
        floor: Some((
            "the cycle's two compare-and-set Txns, raw client".into(),
            txns,
        )),
        other_floors: vec![("put + delete (one key)".into(), plain)],
        peers: vec![(
            "Lock RPC + Unlock RPC".into(),
            harness::cycle(LockRpc::connect(&url, "bench/etcd-lock-rpc").await),
        )],
        contended_peers: vec![("etcd Lock RPC".into(), rpc)],
        backend_instance: connect(&url).await,
        contenders,
        floor_target: Some(0.9),
    };
    let mut report = lineup::measure(lineup, &settings).await;
    let _ = raw.lease_client().revoke(lease).await;
    report.store(
        BACKEND,
        format!("etcd {version}"),
        "single member launched by the bench; WAL fsync on every commit (etcd's default)",
    );
    let probe = Server {
        addr: store.addr(),
        metrics: !url.starts_with("https"),
        pid: (!store.is_external()).then(|| store.pid()).flatten(),
    };
    report.extend(
        scale::run(
            BACKEND,
            || {
                let url = url.clone();
                async move { connect(&url).await }.boxed()
            },
            &probe,
            Pool {
                size: 1,
                what: "one gRPC channel (HTTP/2)".into(),
            },
            &settings,
        )
        .await,
    );
    report
}

/// An etcd server's own counters: `/metrics` over plain HTTP, and the
/// kernel's count of its established client connections.
struct Server {
    addr: std::net::SocketAddr,
    metrics: bool,
    pid: Option<u32>,
}

impl Server {
    async fn metrics_text(&self) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        Some(body)
    }
}

#[async_trait]
impl Probe for Server {
    fn unit(&self) -> &'static str {
        "gRPC messages received (/metrics)"
    }
    async fn requests(&self) -> Option<u64> {
        if !self.metrics {
            return None;
        }
        let text = self.metrics_text().await?;
        let total: f64 = text
            .lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Some(total as u64)
    }
    async fn connections(&self) -> Option<u64> {
        crate::sys::tcp_connections_to(self.addr.port())
    }
    fn pid(&self) -> Option<u32> {
        self.pid
    }
}

/// etcd's built-in Lock RPC: one client with its own lease (kept alive for
/// the run by its 60 s TTL); `Lock` waits in the server until the key of
/// the previous waiter is deleted.
struct LockRpc {
    client: etcd_client::Client,
    lease: i64,
    name: String,
}

impl LockRpc {
    async fn connect(url: &str, name: &str) -> Shared {
        let mut client = etcd_client::Client::connect([url], None)
            .await
            .expect("connect lock rpc client");
        let lease = client.lease_grant(60, None).await.expect("lease").id();
        Arc::new(LockRpc {
            client,
            lease,
            name: name.to_string(),
        })
    }
}

#[async_trait]
impl Client for LockRpc {
    async fn acquire(&self, deadline: Instant) -> Option<Held> {
        let mut client = self.client.clone();
        let options = LockOptions::new().with_lease(self.lease);
        let reply =
            tokio::time::timeout_at(deadline, client.lock(self.name.as_str(), Some(options)))
                .await
                .ok()?
                .expect("Lock RPC");
        Some(Box::new(reply.key().to_vec()))
    }

    async fn release(&self, held: Held) {
        let key = held.downcast::<Vec<u8>>().expect("a lock key");
        self.client.clone().unlock(*key).await.expect("Unlock RPC");
    }
}
