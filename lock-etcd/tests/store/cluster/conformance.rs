//! The whole conformance suite again, against a 3-member etcd cluster from
//! the harness, clients connected to every member. The crash and pause cases
//! get a private cluster and hurt its *leader*: their `kill -9` + restart is
//! a leader loss, an election, and the old leader rejoining as a follower.
//!
//! Its cross-process cases start this binary again as the lock-taker helper
//! (`cluster::conformance::lock_taker_process`), which joins the same
//! cluster through `LOCK_TEST_ETCD_CLUSTER_ENDPOINTS`.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use lock_conformance::kit::stores::{Cluster, etcd};
use lock_conformance::{Factory, StoreControl};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::async_trait;
use lockcore::{LockBackend, LockError};

/// Set for the lock-taker helper process, so it joins the same cluster.
const ENDPOINTS_VAR: &str = "LOCK_TEST_ETCD_CLUSTER_ENDPOINTS";

struct ClusterFactory {
    endpoints: Vec<String>,
    leader: Option<Arc<Member>>,
}

/// One member of a cluster, as the suite's store handle.
struct Member {
    cluster: Arc<Cluster>,
    index: usize,
}

impl Member {
    fn store(&self) -> &dyn StoreControl {
        &self.cluster.members[self.index]
    }
}

#[async_trait]
impl StoreControl for Member {
    fn addr(&self) -> SocketAddr {
        self.store().addr()
    }
    fn durable(&self) -> bool {
        self.store().durable()
    }
    async fn kill(&self) -> io::Result<()> {
        self.store().kill().await
    }
    async fn restart(&self) -> io::Result<()> {
        self.store().restart().await
    }
    async fn pause(&self) -> io::Result<()> {
        self.store().pause().await
    }
    async fn resume(&self) -> io::Result<()> {
        self.store().resume().await
    }
}

fn launch() -> io::Result<ClusterFactory> {
    let cluster = Arc::new(etcd::start_cluster(3)?);
    let index = cluster.wait_leader(std::time::Duration::from_secs(20))?;
    Ok(ClusterFactory {
        endpoints: cluster.endpoints(),
        leader: Some(Arc::new(Member { cluster, index })),
    })
}

/// The cluster of this test binary (or, in the helper process, the parent's).
fn factory() -> ClusterFactory {
    if let Ok(endpoints) = std::env::var(ENDPOINTS_VAR) {
        return ClusterFactory {
            endpoints: endpoints.split(',').map(str::to_owned).collect(),
            leader: None,
        };
    }
    static SHARED: OnceLock<Result<ClusterFactory, String>> = OnceLock::new();
    match SHARED.get_or_init(|| launch().map_err(|e| e.to_string())) {
        Ok(shared) => ClusterFactory {
            endpoints: shared.endpoints.clone(),
            leader: shared.leader.clone(),
        },
        Err(e) => panic!("etcd cluster unavailable: {e}"),
    }
}

async fn connect(endpoints: Vec<String>) -> Result<Arc<dyn LockBackend>, LockError> {
    Ok(Arc::new(
        EtcdBackend::connect_with(EtcdConfig::new(endpoints)).await?,
    ))
}

#[async_trait]
impl Factory for ClusterFactory {
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        connect(self.endpoints.clone()).await
    }

    fn store(&self) -> Option<Arc<dyn StoreControl>> {
        self.leader.clone().map(|m| m as Arc<dyn StoreControl>)
    }

    async fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        // Through the proxy only: that is the connection the case hurts.
        Some(connect(vec![format!("http://{addr}")]).await)
    }

    async fn private(&self) -> Option<Result<Arc<dyn Factory>, LockError>> {
        let launched = tokio::task::spawn_blocking(launch).await.ok()?;
        Some(
            launched
                .map(|f| Arc::new(f) as Arc<dyn Factory>)
                .map_err(|e| LockError::config(format!("no private etcd cluster: {e}"))),
        )
    }

    fn helper_env(&self) -> Vec<(String, String)> {
        vec![(ENDPOINTS_VAR.to_owned(), self.endpoints.join(","))]
    }
}

lock_conformance::suite!(
    factory(),
    // The leader's monotonic lease timer: no wall-clock step moves it.
    expect_skips = [server_clock_steps_are_judged_on_the_server],
);
