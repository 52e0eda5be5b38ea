#![doc = include_str!("../README.md")]
mod backend;
mod client;
mod clock;
mod config;
mod error;
mod files;
mod held;
#[cfg_attr(not(target_os = "linux"), path = "notify_none.rs")]
mod notify;
mod presence;
mod probe;
mod sql;

pub use backend::SqliteBackend;
pub use config::SqliteConfig;
pub use presence::presence_fd;
