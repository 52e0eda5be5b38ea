//! MemoryBackend: the client layer's own cost (`Locker`, the renewer, the
//! wait loop) with no store round trip at all.

use std::sync::Arc;

use futures::FutureExt;
use lockcore::{LockBackend, MemoryBackend};

use crate::Settings;
use crate::lineup::{self, Lineup};
use crate::report::Report;
use crate::scale::{self, InProcess, Pool};

const BACKEND: &str = "memory";

pub(crate) async fn run(settings: Settings) -> Report {
    // Clones share one store: each contender is a client of it.
    let store = MemoryBackend::new();
    let instance = || Arc::new(store.clone()) as Arc<dyn LockBackend>;
    let lineup = Lineup {
        backend: BACKEND.into(),
        round_trip: None,
        floor: None,
        other_floors: Vec::new(),
        peers: Vec::new(),
        contended_peers: Vec::new(),
        backend_instance: instance(),
        contenders: (0..settings.contenders).map(|_| instance()).collect(),
        floor_target: None,
    };
    let mut report = lineup::measure(lineup, &settings).await;
    report.store(
        BACKEND,
        "lockcore MemoryBackend",
        "in process, nothing durable",
    );
    report.extend(
        scale::run(
            BACKEND,
            || {
                let store = store.clone();
                async move { Arc::new(store) as Arc<dyn LockBackend> }.boxed()
            },
            &InProcess,
            Pool {
                size: 0,
                what: "none (in process)".into(),
            },
            &settings,
        )
        .await,
    );
    report
}
