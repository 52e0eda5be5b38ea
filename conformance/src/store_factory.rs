//! `StoreFactory`: the conformance [`Factory`] over a launched (or external)
//! store, for adapters' `suite!` invocations, and what the fault cases may
//! do to such a store ([`StoreControl`]).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use lockcore::{LockBackend, LockError};

use crate::kit::stores::{Kind, Store, partial_run_allowed};
use crate::{Factory, StoreControl};

type Connect = Arc<
    dyn Fn(String) -> BoxFuture<'static, Result<Arc<dyn LockBackend>, LockError>> + Send + Sync,
>;
type Launcher = Arc<dyn Fn() -> io::Result<Store> + Send + Sync>;

/// Hands out clients of one store by calling `connect(url)`: the store's URL
/// for [`client`](Factory::client), the URL rewritten to a fault proxy for
/// [`client_via`](Factory::client_via), and a freshly launched private store
/// for [`private`](Factory::private) (crash and pause cases must not hurt the
/// store other tests share).
pub struct StoreFactory {
    kind: Kind,
    store: Result<Arc<Store>, String>,
    private: Option<Launcher>,
    connect: Connect,
}

impl fmt::Debug for StoreFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreFactory")
            .field("kind", &self.kind)
            .field("store", &self.store)
            .field("private", &self.private.is_some())
            .finish_non_exhaustive()
    }
}

fn boxed<F, Fut, B>(connect: F) -> Connect
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B, LockError>> + Send + 'static,
    B: LockBackend,
{
    Arc::new(move |url| {
        let fut = connect(url);
        Box::pin(async move { Ok(Arc::new(fut.await?) as Arc<dyn LockBackend>) })
    })
}

/// A factory over the shared store of `kind` (`try_shared`), launching
/// private ones with `private`. Used by each store module's `factory`.
///
/// # Panics
/// When the shared store cannot be had, unless its binaries are missing in
/// an explicitly partial run, where every case then skips, loudly.
fn factory<F, Fut, B>(
    kind: Kind,
    try_shared: impl FnOnce() -> io::Result<Arc<Store>>,
    private: impl Fn() -> io::Result<Store> + Send + Sync + 'static,
    connect: F,
) -> StoreFactory
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B, LockError>> + Send + 'static,
    B: LockBackend,
{
    let store = match try_shared() {
        Ok(store) => Ok(store),
        Err(e) if e.kind() == io::ErrorKind::NotFound && partial_run_allowed() => {
            eprintln!("SKIP: {kind} conformance cases skipped (LOCK_TEST_PARTIAL=1): {e}");
            Err(format!(
                "{kind} is not installed and this is a partial run (LOCK_TEST_PARTIAL=1): {e}"
            ))
        }
        Err(e) => panic!("{kind} store unavailable: {e}"),
    };
    StoreFactory {
        kind,
        store,
        private: Some(Arc::new(private)),
        connect: boxed(connect),
    }
}

impl StoreFactory {
    /// A factory over `store` (say, one started with custom options), with no
    /// private store unless [`with_private`](Self::with_private) adds one.
    pub fn new<F, Fut, B>(store: Arc<Store>, connect: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        StoreFactory {
            kind: store.kind(),
            store: Ok(store),
            private: None,
            connect: boxed(connect),
        }
    }

    /// Sets how private stores for the crash and pause cases are launched.
    pub fn with_private(
        mut self,
        launch: impl Fn() -> io::Result<Store> + Send + Sync + 'static,
    ) -> Self {
        self.private = Some(Arc::new(launch));
        self
    }

    /// The store, unless it was skipped in a partial run.
    pub fn store_handle(&self) -> Option<&Arc<Store>> {
        self.store.as_ref().ok()
    }

    fn require(&self) -> Result<&Arc<Store>, LockError> {
        self.store
            .as_ref()
            .map_err(|why| LockError::config(format!("no {} store: {why}", self.kind)))
    }
}

#[async_trait]
impl Factory for StoreFactory {
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        let url = self.require()?.url();
        (self.connect)(url).await
    }

    fn store(&self) -> Option<Arc<dyn StoreControl>> {
        let store = self.store.as_ref().ok()?;
        Some(store.clone())
    }

    async fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<Result<Arc<dyn LockBackend>, LockError>> {
        let url = match self.require() {
            Ok(store) => store.url_via(addr),
            Err(e) => return Some(Err(e)),
        };
        Some((self.connect)(url).await)
    }

    async fn private(&self) -> Option<Result<Arc<dyn Factory>, LockError>> {
        let store = self.store.as_ref().ok()?;
        if store.is_external() {
            return None;
        }
        let launch = self.private.clone()?;
        let kind = self.kind;
        let launched = tokio::task::spawn_blocking(move || launch())
            .await
            .map_err(|e| io::Error::other(format!("launcher panicked: {e}")))
            .and_then(|r| r);
        Some(match launched {
            Ok(store) => Ok(Arc::new(StoreFactory {
                kind,
                store: Ok(Arc::new(store)),
                private: None,
                connect: self.connect.clone(),
            }) as Arc<dyn Factory>),
            Err(e) => Err(LockError::config_caused_by(
                format!("could not launch a private {kind} store"),
                e,
            )),
        })
    }

    fn skip_all(&self) -> Option<String> {
        self.store.as_ref().err().cloned()
    }

    fn helper_env(&self) -> Vec<(String, String)> {
        match &self.store {
            Ok(store) => vec![(self.kind.env_var().to_owned(), store.url())],
            Err(_) => Vec::new(),
        }
    }
}

#[async_trait]
impl StoreControl for Store {
    fn addr(&self) -> SocketAddr {
        Store::addr(self)
    }

    fn durable(&self) -> bool {
        Store::durable(self)
    }

    fn external(&self) -> Option<String> {
        self.why_external()
    }

    async fn kill(&self) -> io::Result<()> {
        self.kill_now()
    }

    async fn restart(&self) -> io::Result<()> {
        // Start-up takes up to a few seconds of polling; keep the runtime's
        // worker free meanwhile where the runtime allows it.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| self.restart_now())
            }
            _ => self.restart_now(),
        }
    }

    async fn pause(&self) -> io::Result<()> {
        self.pause_now()
    }

    async fn resume(&self) -> io::Result<()> {
        self.resume_now()
    }

    async fn step_clock(&self, offset_secs: i64) -> io::Result<()> {
        self.set_clock_offset(offset_secs)
    }
}

/// The factories over the kit's stores (`suite!(StoreFactory::redis(connect))`):
/// the shared store of the test binary, a private one for the cases that
/// crash, pause or step the clock of theirs. `connect` gets the store's URL,
/// or the same through a fault proxy. The kit's launchers know nothing of
/// the suite; the suite's factories are here.
impl StoreFactory {
    /// Redis, with a private durable Redis (AOF, `appendfsync always`) for
    /// the crash cases. URLs: `redis://127.0.0.1:P`.
    pub fn redis<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        use crate::kit::stores::redis;
        factory(
            Kind::Redis,
            redis::try_shared,
            || redis::start(redis::Options::durable()),
            connect,
        )
    }

    /// PostgreSQL, with private servers started under libfaketime (so their
    /// clock can be stepped). URLs: `postgres://postgres@127.0.0.1:P/postgres`.
    pub fn postgres<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        use crate::kit::stores::postgres;
        factory(
            Kind::Postgres,
            postgres::try_shared,
            || postgres::start(postgres::Options::default().faketime(true)),
            connect,
        )
    }

    /// [`postgres`](Self::postgres) over servers of their own started with
    /// extra `settings` (`-c name=value`).
    ///
    /// # Panics
    /// When called again in the same binary with different settings.
    pub fn postgres_with_settings<F, Fut, B>(settings: &[(&str, &str)], connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        use crate::kit::stores::postgres;
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let shared = settings.clone();
        factory(
            Kind::Postgres,
            move || postgres::try_shared_with_settings(&shared),
            move || {
                let options = postgres::Options::default().faketime(true);
                postgres::start(postgres::with_settings(options, &settings))
            },
            connect,
        )
    }

    /// etcd, with a private one for the crash cases. URLs: `etcd://127.0.0.1:P`.
    pub fn etcd<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        use crate::kit::stores::etcd;
        factory(
            Kind::Etcd,
            etcd::try_shared,
            || etcd::start(etcd::Options::default()),
            connect,
        )
    }

    /// ZooKeeper, with a private one for the crash cases. URLs: `zk://127.0.0.1:P`.
    pub fn zookeeper<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        use crate::kit::stores::zookeeper;
        factory(
            Kind::ZooKeeper,
            zookeeper::try_shared,
            || zookeeper::start(zookeeper::Options::default()),
            connect,
        )
    }
}
