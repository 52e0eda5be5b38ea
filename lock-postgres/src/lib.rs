#![doc = include_str!("../README.md")]
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

pub use backend::PostgresBackend;
pub use config::PostgresConfig;
pub use fence::{ResourceFence, fenced_write, fenced_write_slot};

/// Views of a backend's internals for this crate's own tests; not part of
/// the API.
#[doc(hidden)]
pub use backend::testing;

/// The sqlx version this crate speaks, for [`PostgresConfig::from_options`]
/// and [`PostgresConfig::from_pool`].
pub use sqlx;
