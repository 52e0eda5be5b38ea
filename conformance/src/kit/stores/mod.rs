//! Real stores for the tests: Redis, PostgreSQL, etcd and ZooKeeper started
//! as plain child processes on free loopback ports, each with its data in a
//! fresh temp dir, and hurt on demand (`kill -9`, `SIGSTOP`/`SIGCONT`,
//! restart on the same data and port).
//!
//! Needs the `stores` feature. Each store has a module with the same shape:
//!
//! - `start(Options) -> io::Result<Store>`: a private instance, stopped
//!   cleanly on drop. Tests that kill, pause or restart a store use their own.
//! - `shared() -> Arc<Store>`: one instance per test binary, launched on first
//!   use, or the server named by the store's `LOCK_TEST_*` variable
//!   ([`Store::is_external`]); `shared_or_skip()` for local partial runs.
//!
//! ```no_run
//! # #[cfg(feature = "stores")] fn main() -> std::io::Result<()> {
//! use lock_conformance::kit::stores::redis;
//! let store = redis::start(redis::Options::default())?; // AOF, appendfsync always
//! println!("{}", store.url()); // redis://127.0.0.1:2xxxx
//! store.kill_now()?;
//! store.restart_now()?; // same port, same data
//! # Ok(()) }
//! # #[cfg(not(feature = "stores"))] fn main() {}
//! ```
//!
//! # Process hygiene
//! Servers are forked from one long-lived thread with `PR_SET_PDEATHSIG =
//! SIGKILL`, each in its own process group, so they die with the test binary
//! even though `static` shared stores are never dropped; shared stores' data
//! dirs are removed by an `atexit` hook, and dirs left by crashed runs are
//! swept at the next launch.
//!
//! # Missing binaries
//! A missing store binary fails the test with the Debian package to install
//! (`scripts/test-all.sh` installs them all). Only with `LOCK_TEST_PARTIAL=1`,
//! and never when `CI=true`, does `shared_or_skip` (and `factory`) skip
//! instead, with a loud `SKIP` line.

mod client_tls;
mod cluster;
mod dirs;
pub mod etcd;
mod kind;
pub mod postgres;
pub mod redis;
pub mod redis_cluster;
mod shared;
mod store;
mod url;
pub mod zookeeper;

pub use crate::kit::env::partial_run_allowed;
pub use client_tls::ClientTls;
pub use cluster::Cluster;
pub use kind::Kind;
pub use store::Store;

use crate::kit::{net, process};
use dirs::{data_dir, set_mode, write_clock_file};
use kind::{missing, which};
use shared::{SharedSlot, shared_or_skip, shared_store};
use store::{Launch, Probe, Spec};
