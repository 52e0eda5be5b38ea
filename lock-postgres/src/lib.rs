#![doc = include_str!("../README.md")]
mod admin;
mod backend;
mod client;
mod config;
mod error;
mod fence;
mod ident;
mod keys;
mod listener;
mod notify;
mod permits;
mod pool;
mod probe;
mod registry;
mod schema;
mod sql;
mod turnstile;
mod urls;
mod wait;

pub use backend::PostgresBackend;
pub use config::PostgresConfig;
pub use fence::{ResourceFence, fenced_write, fenced_write_slot};

/// The sqlx version this crate speaks, for [`PostgresConfig::from_options`]
/// and [`PostgresConfig::from_pool`].
pub use sqlx;
