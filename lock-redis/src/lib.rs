#![doc = include_str!("../README.md")]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

mod backend;
mod config;
mod connection;
mod durability;
mod error;
mod fenced;
mod keys;
mod notify;
mod scripts;
#[cfg(feature = "tls")]
mod tls;

pub use backend::{MAX_TTL, RedisBackend};
pub use config::RedisConfig;
pub use durability::{Eviction, FENCE_ASSUMPTION, Persistence};
pub use fenced::{Fenced, fenced_apply};

/// The Redis client crate this adapter is built on, for
/// [`RedisConfig::from_client`], [`RedisConfig::connection`] and
/// [`fenced_apply`] commands.
pub use redis;
