//! The conformance [`Factory`] over a Redis Cluster the kit launches (or
//! the one `LOCK_TEST_REDIS_CLUSTER_URL` names), and the Cluster as the one
//! store of the fault cases.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use lockcore::{LockBackend, LockError};

use crate::kit::env::{self, partial_run_allowed};
use crate::kit::stores::Store;
use crate::kit::stores::redis_cluster::{RedisCluster, start, try_shared};
use crate::{Factory, StoreControl};

type Connect = Arc<
    dyn Fn(String) -> BoxFuture<'static, Result<Arc<dyn LockBackend>, LockError>> + Send + Sync,
>;

/// The conformance [`Factory`] over the shared Cluster: clients connect
/// with the Cluster's URL; helper processes get it as
/// `LOCK_TEST_REDIS_CLUSTER_URL`.
pub struct ClusterFactory {
    cluster: Result<Arc<RedisCluster>, String>,
    connect: Connect,
}

impl fmt::Debug for ClusterFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterFactory")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

/// A [`ClusterFactory`] connecting with `connect`. A missing `redis-server`
/// or `redis-cli` fails loudly, unless the run is explicitly partial
/// (`LOCK_TEST_PARTIAL=1`, never in CI): then every case skips, with a
/// SKIP line.
///
/// # Panics
/// When the Cluster cannot be started.
pub fn redis_cluster<F, Fut, B>(connect: F) -> ClusterFactory
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B, LockError>> + Send + 'static,
    B: LockBackend,
{
    let cluster = match try_shared() {
        Ok(cluster) => Ok(cluster),
        Err(e) if e.kind() == io::ErrorKind::NotFound && partial_run_allowed() => {
            eprintln!("SKIP: redis cluster conformance cases skipped (LOCK_TEST_PARTIAL=1): {e}");
            Err(format!(
                "redis is not installed and this is a partial run (LOCK_TEST_PARTIAL=1): {e}"
            ))
        }
        Err(e) => panic!("redis cluster unavailable: {e}"),
    };
    ClusterFactory {
        cluster,
        connect: Arc::new(move |url| {
            let fut = connect(url);
            Box::pin(async move { Ok(Arc::new(fut.await?) as Arc<dyn LockBackend>) })
        }),
    }
}

#[async_trait]
impl Factory for ClusterFactory {
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        let cluster = self
            .cluster
            .as_ref()
            .map_err(|why| LockError::config(format!("no redis cluster: {why}")))?;
        (self.connect)(cluster.url()).await
    }

    fn store(&self) -> Option<Arc<dyn StoreControl>> {
        let cluster = self.cluster.as_ref().ok()?;
        Some(cluster.clone())
    }

    async fn private(&self) -> Option<Result<Arc<dyn Factory>, LockError>> {
        let cluster = self.cluster.as_ref().ok()?;
        if cluster.is_external() {
            return None;
        }
        let launched = tokio::task::spawn_blocking(start)
            .await
            .map_err(|e| io::Error::other(format!("launcher panicked: {e}")))
            .and_then(|r| r);
        Some(match launched {
            Ok(cluster) => Ok(Arc::new(ClusterFactory {
                cluster: Ok(Arc::new(cluster)),
                connect: self.connect.clone(),
            }) as Arc<dyn Factory>),
            Err(e) => Err(LockError::config_caused_by(
                "could not launch a private redis cluster",
                e,
            )),
        })
    }

    /// A client whose link to each node goes through that node's proxy:
    /// the URL's `node_map` sends every connection to a node, however it
    /// learnt the node's address, to the proxy in front of it.
    async fn client_via_each(
        &self,
        routes: &[(SocketAddr, SocketAddr)],
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        let cluster = self.cluster.as_ref().ok()?;
        let map = routes
            .iter()
            .map(|(node, proxy)| format!("{node}={proxy}"))
            .collect::<Vec<_>>()
            .join(",");
        let url = cluster.url();
        let joiner = if url.contains('?') { '&' } else { '?' };
        Some((self.connect)(format!("{url}{joiner}node_map={map}")).await)
    }

    fn skip_all(&self) -> Option<String> {
        self.cluster.as_ref().err().cloned()
    }

    fn helper_env(&self) -> Vec<(String, String)> {
        match &self.cluster {
            Ok(cluster) => vec![(env::REDIS_CLUSTER_URL.name().to_owned(), cluster.url())],
            Err(_) => Vec::new(),
        }
    }
}

/// Runs blocking `work` off the runtime's worker where the runtime allows.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// The whole Cluster as the one store of the fault cases: every node is
/// killed, paused, resumed or restarted together.
#[async_trait]
impl StoreControl for RedisCluster {
    fn addr(&self) -> SocketAddr {
        self.nodes
            .first()
            .map_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)), Store::addr)
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(Store::addr).collect()
    }

    fn durable(&self) -> bool {
        self.nodes.iter().all(Store::durable)
    }

    fn external(&self) -> Option<String> {
        self.is_external()
            .then(|| format!("the Redis Cluster {} was launched elsewhere", self.url()))
    }

    async fn kill(&self) -> io::Result<()> {
        self.nodes.iter().try_for_each(Store::kill_now)
    }

    async fn restart(&self) -> io::Result<()> {
        blocking(|| {
            self.nodes.iter().try_for_each(Store::restart_now)?;
            self.wait_formed()
        })
    }

    async fn pause(&self) -> io::Result<()> {
        self.nodes.iter().try_for_each(Store::pause_now)
    }

    async fn resume(&self) -> io::Result<()> {
        self.nodes.iter().try_for_each(Store::resume_now)
    }
}
