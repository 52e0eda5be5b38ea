#![doc = include_str!("../README.md")]
mod backend;
mod client;
mod clock;
mod config;
mod error;
mod fence;
mod files;
mod held;
#[cfg_attr(not(target_os = "linux"), path = "notify_none.rs")]
mod notify;
mod presence;
mod probe;
mod sql;

pub use backend::SqliteBackend;
pub use config::SqliteConfig;
pub use fence::{ResourceFence, fenced_write, fenced_write_slot};
pub use presence::presence_fd;
/// The sqlx this crate is built on: open the database your fenced writes go
/// to with it ([`fenced_write`] takes its `Transaction`).
pub use sqlx;
