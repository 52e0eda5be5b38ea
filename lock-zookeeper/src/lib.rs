#![doc = include_str!("../README.md")]
mod acls;
mod backend;
mod client;
mod close;
mod config;
mod connect;
mod error;
mod fence;
mod floor;
mod held;
mod holders;
mod line;
mod names;
mod notify;
mod permits;
mod probe;
mod queue;
mod quiet;
mod renew;
mod requests;
mod session;
mod wait;

pub use backend::ZooKeeperBackend;
pub use config::ZooKeeperConfig;
pub use fence::fenced_write;
pub use names::decode_segment;
/// The ZooKeeper client this backend is built on, re-exported so callers use
/// the same version (see [`ZooKeeperBackend::zk_client`]).
pub use zookeeper_client as zk;
