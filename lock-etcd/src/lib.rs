#![doc = include_str!("../README.md")]
mod backend;
mod client;
mod close;
mod config;
mod conn;
mod error;
mod fence;
mod floor;
mod hub;
mod keys;
mod line;
mod notify;
mod permits;
mod probe;
mod record;
mod renew;
mod session;
mod wait;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, MAX_PREFIX_BYTES, TlsConfig};
/// The etcd client this backend is built on, for [`EtcdBackend::fence_compare`]
/// in your own transactions.
pub use etcd_client;
pub use probe::MAX_TTL;
