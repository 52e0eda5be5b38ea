#![doc = include_str!("../README.md")]
// A grant's future nests the client's layers (close tracking, failover
// check, replication wait, the connection's tracked invoke) over redis's
// own: computing its layout from scratch goes past rustc's default 128.
#![recursion_limit = "256"]
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

pub use backend::{MAX_TTL, RedisBackend};
pub use config::RedisConfig;
pub use connection::probe::{Eviction, FENCE_ASSUMPTION, Persistence};
pub use fence::fenced_write;

/// The Redis client crate this adapter is built on, for
/// [`RedisConfig::from_client`], [`RedisConfig::connection`] and
/// [`fenced_write`] commands.
pub use redis;
