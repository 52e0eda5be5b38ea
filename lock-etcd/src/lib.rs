#![doc = include_str!("../README.md")]

// The same roles in every adapter's `src/`: `backend` (the public type and
// its `LockBackend`), `config` (the URL and its options), `connection`
// (connecting, sessions, closing), `keys` (where things live in etcd),
// `locks`, `permits`, `rw` (reader-writer locks), `fence` (fence offset, resource-side fencing), `wait`
// (the line of waiters and every watch) and `error`.

mod backend;
mod config;
mod connection;
mod error;
mod fence;
mod keys;
mod locks;
mod permits;
mod rw;
mod wait;

pub use backend::EtcdBackend;
#[doc(hidden)]
pub use backend::testing;
pub use config::{EtcdConfig, MAX_PREFIX_BYTES, TlsConfig};
pub use connection::probe::MAX_TTL;
/// The etcd client this backend is built on, for [`EtcdBackend::fence_compare`]
/// in your own transactions.
pub use etcd_client;
