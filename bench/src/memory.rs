//! MemoryBackend: the client layer's own cost, no store round trip.

use std::sync::Arc;

use lockcore::{LockBackend, LockName, MemoryBackend};

use crate::Settings;
use crate::harness::{self, Row};

pub async fn run(settings: &Settings) -> Vec<Row> {
    let store = MemoryBackend::new();
    let name = LockName::new("bench/memory").unwrap();
    let backend: Arc<dyn LockBackend> = Arc::new(store.clone());
    let cycles =
        harness::uncontended(backend, &name, settings.ttl, settings.warmup, settings.run).await;
    let clients: Vec<Arc<dyn LockBackend>> = (0..settings.contenders)
        .map(|_| Arc::new(store.clone()) as Arc<dyn LockBackend>)
        .collect();
    let contended = harness::contended(clients, &name, settings.ttl, settings.run).await;
    vec![
        Row::new("memory", "uncontended acquire+release", &cycles),
        Row::new(
            "memory",
            format!("{}-way contended (hand-off)", settings.contenders),
            &contended.handoffs,
        )
        .note(format!("FIFO share {:.0}%", contended.fifo_share * 100.0)),
    ]
}
