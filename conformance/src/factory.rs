//! How the suite gets clients of the store under test.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{LockBackend, LockError};

use crate::control::StoreControl;

/// Hands out independent clients of one store.
///
/// Cases need several clients (a holder, a contender, an admin), each with
/// its own connection, the way separate processes would have. A factory may
/// also expose the store's process ([`store`](Self::store)) and connect
/// through an address of the suite's choosing ([`client_via`](Self::client_via))
/// so the fault cases can kill, pause or cut it off; without them those cases
/// are skipped, and the report says so.
#[async_trait]
pub trait Factory: Send + Sync + 'static {
    /// A new client with its own connection(s) to the store.
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError>;

    /// The store's process and address, for fault cases.
    fn store(&self) -> Option<Arc<dyn StoreControl>> {
        None
    }

    /// A new client that reaches the store through `addr` (a fault proxy in
    /// front of [`StoreControl::addr`]) instead of the store's own address.
    async fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        let _ = addr;
        None
    }

    /// A new client that reaches each of the store's servers through its
    /// proxy: `routes` pairs each of [`StoreControl::addrs`] with the proxy
    /// address in front of it, the first one first. By default: through
    /// [`client_via`](Self::client_via) for a store of one server, `None`
    /// for more.
    async fn client_via_each(
        &self,
        routes: &[(SocketAddr, SocketAddr)],
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        match routes {
            [(_, proxy)] => self.client_via(*proxy).await,
            _ => None,
        }
    }

    /// Why [`client_via`](Self::client_via) cannot work for this store by
    /// its nature (a file on a local disk has no network link to cut), for
    /// the skip message of the cases that need a fault proxy.
    fn no_proxy_reason(&self) -> Option<String> {
        None
    }

    /// A factory over a fresh store of the same kind that only the calling
    /// case uses, for cases that kill, pause or restart the store (doing that
    /// to a store other tests share would break them). `None`: not offered
    /// (an external store, or no launcher), and those cases skip.
    async fn private(&self) -> Option<Result<Arc<dyn Factory>, LockError>> {
        None
    }

    /// `Some(why)` when every case must be skipped: the store is missing in an
    /// explicitly partial local run (`LOCK_TEST_PARTIAL=1`).
    fn skip_all(&self) -> Option<String> {
        None
    }

    /// Environment for a helper process (the lock-taker, a re-run of this
    /// test binary) so that it evaluates the same factory against the *same*
    /// store instead of launching its own: e.g. `LOCK_TEST_REDIS_URL=...`
    /// (see [`kit::env`](crate::kit::env)).
    fn helper_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// A factory handing out clones of one backend value: for backends whose
/// clones are independent clients of one store, like `MemoryBackend`.
pub fn shared<B: LockBackend + Clone>(backend: B) -> SharedFactory<B> {
    SharedFactory(backend)
}

/// See [`shared`].
#[derive(Debug, Clone)]
pub struct SharedFactory<B>(B);

#[async_trait]
impl<B: LockBackend + Clone> Factory for SharedFactory<B> {
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(self.0.clone()))
    }
}

/// A factory from an async closure that connects a new client.
///
/// ```no_run
/// # use lockcore::MemoryBackend;
/// let factory = lock_conformance::from_fn(|| async { Ok(MemoryBackend::new()) });
/// ```
pub fn from_fn<F, Fut, B>(connect: F) -> FnFactory<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B, LockError>> + Send,
    B: LockBackend,
{
    FnFactory(connect)
}

/// See [`from_fn`].
pub struct FnFactory<F>(F);

impl<F> fmt::Debug for FnFactory<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnFactory")
    }
}

#[async_trait]
impl<F, Fut, B> Factory for FnFactory<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B, LockError>> + Send,
    B: LockBackend,
{
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new((self.0)().await?))
    }
}

#[async_trait]
impl<T: Factory + ?Sized> Factory for Arc<T> {
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        (**self).client().await
    }
    fn store(&self) -> Option<Arc<dyn StoreControl>> {
        (**self).store()
    }
    async fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        (**self).client_via(addr).await
    }
    async fn client_via_each(
        &self,
        routes: &[(SocketAddr, SocketAddr)],
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        (**self).client_via_each(routes).await
    }
    fn no_proxy_reason(&self) -> Option<String> {
        (**self).no_proxy_reason()
    }
    async fn private(&self) -> Option<Result<Arc<dyn Factory>, LockError>> {
        (**self).private().await
    }
    fn skip_all(&self) -> Option<String> {
        (**self).skip_all()
    }
    fn helper_env(&self) -> Vec<(String, String)> {
        (**self).helper_env()
    }
}
