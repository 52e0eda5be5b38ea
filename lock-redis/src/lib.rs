#![doc = include_str!("../README.md")]
mod backend;
mod client;
mod config;
mod connection;
mod error;
mod fence;
mod keys;
mod notify;
mod probe;
mod scripts;
#[cfg(feature = "tls")]
mod tls;
mod wait;

pub use backend::{MAX_TTL, RedisBackend};
pub use config::RedisConfig;
pub use fence::fenced_write;
pub use probe::{Eviction, FENCE_ASSUMPTION, Persistence};

/// The Redis client crate this adapter is built on, for
/// [`RedisConfig::from_client`], [`RedisConfig::connection`] and
/// [`fenced_write`] commands.
pub use redis;
