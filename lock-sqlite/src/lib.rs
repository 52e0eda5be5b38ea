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

pub use backend::SqliteBackend;
pub use config::SqliteConfig;
pub use fence::resource::{ResourceFence, fenced_write, fenced_write_slot};
pub use locks::presence::presence_fd;
/// The sqlx this crate is built on: open the database your fenced writes go
/// to with it ([`fenced_write`] takes its `Transaction`).
pub use sqlx;
