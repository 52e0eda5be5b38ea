//! The conformance factories over the kit's real stores: `suite!` against
//! Redis, PostgreSQL, etcd or ZooKeeper launched as a child process (or an
//! external server), with fault proxies and private stores for the fault
//! cases. Needs the `stores` feature.
//!
//! ```ignore
//! use lock_conformance::stores::redis;
//! lock_conformance::suite!(redis::factory(|url| async move { MyBackend::connect(&url).await }));
//! ```
//!
//! Each store module here is the kit's launcher module
//! ([`kit::stores`](crate::kit::stores)) plus its `factory`, so the older
//! paths (`stores::redis::start`, `stores::Store`, `stores::until`...) keep
//! working; new code imports the launcher from `lock_conformance::kit`.

mod factory;

pub use factory::{StoreFactory, factory};

pub use crate::kit::pki;
pub use crate::kit::poll::{eventually, until};
pub use crate::kit::stores::{Cluster, Kind, Store, partial_run_allowed};

use std::future::Future;

use lockcore::{LockBackend, LockError};

/// Redis: the kit's launcher and a conformance factory.
pub mod redis {
    pub use crate::kit::stores::redis::*;

    use super::*;

    /// A conformance [`Factory`](crate::Factory) over the shared Redis, with
    /// a private durable Redis for the crash cases. `connect` gets a URL
    /// (`redis://127.0.0.1:P`, or the same through a fault proxy).
    pub fn factory<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        super::factory(
            Kind::Redis,
            try_shared,
            || start(Options::durable()),
            connect,
        )
    }
}

/// PostgreSQL: the kit's launcher and conformance factories.
pub mod postgres {
    pub use crate::kit::stores::postgres::*;

    use super::*;

    /// A conformance [`Factory`](crate::Factory) over the shared PostgreSQL,
    /// with a private one for the crash, pause and clock-step cases (started
    /// under libfaketime, so its clock can be stepped). `connect` gets a URL
    /// (`postgres://postgres@127.0.0.1:P/postgres`).
    pub fn factory<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        super::factory(
            Kind::Postgres,
            try_shared,
            || start(Options::default().faketime(true)),
            connect,
        )
    }

    /// [`factory`] over servers of their own started with extra `settings`
    /// (`-c name=value`): a shared one for this test binary
    /// ([`try_shared_with_settings`]) and private ones (under libfaketime)
    /// for the crash, pause and clock-step cases.
    ///
    /// # Panics
    /// When called again in the same binary with different settings.
    pub fn factory_with_settings<F, Fut, B>(settings: &[(&str, &str)], connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let shared = settings.clone();
        super::factory(
            Kind::Postgres,
            move || try_shared_with_settings(&shared),
            move || start(with_settings(Options::default().faketime(true), &settings)),
            connect,
        )
    }
}

/// etcd: the kit's launcher and a conformance factory.
pub mod etcd {
    pub use crate::kit::stores::etcd::*;

    use super::*;

    /// A conformance [`Factory`](crate::Factory) over the shared etcd, with
    /// a private one for the crash cases. `connect` gets a URL
    /// (`etcd://127.0.0.1:P`: `EtcdBackend::connect` takes it).
    pub fn factory<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        super::factory(
            Kind::Etcd,
            try_shared,
            || start(Options::default()),
            connect,
        )
    }
}

/// ZooKeeper: the kit's launcher and a conformance factory.
pub mod zookeeper {
    pub use crate::kit::stores::zookeeper::*;

    use super::*;

    /// A conformance [`Factory`](crate::Factory) over the shared ZooKeeper,
    /// with a private one for the crash cases. `connect` gets a URL
    /// (`zk://127.0.0.1:P`: `ZooKeeperBackend::connect` takes it).
    pub fn factory<F, Fut, B>(connect: F) -> StoreFactory
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B, LockError>> + Send + 'static,
        B: LockBackend,
    {
        super::factory(
            Kind::ZooKeeper,
            try_shared,
            || start(Options::default()),
            connect,
        )
    }
}
