//! The test kit: what adapter tests and the suite's own cases use to test
//! against real stores. It never imports the suite (everything outside
//! `kit/`); the suite builds on it.
//!
//! - [`env`](mod@env): every variable the tests read (`LOCK_TEST_*`), in one place,
//!   and the time scale.
//! - [`poll`]: waiting for a condition instead of sleeping on a guess.
//! - [`usage`]: a process's CPU time and memory, for tests that state what
//!   work costs.
//!
//! With the `stores` feature (process control; off by default, so running
//! only the suite pulls none of it):
//!
//! - `stores`: Redis, PostgreSQL, etcd and ZooKeeper launched as child
//!   processes on loopback (or used as external servers), to kill, pause,
//!   restart.
//! - `proxy`: the TCP fault proxy.
//! - `pki`: throwaway CAs and certificates for TLS tests.
//! - `secrets`: a marker password and the checks that it never reaches
//!   errors, `Debug` or tracing output.
//! - `logs`: what a piece of code logs, captured for one test.

pub mod env;
#[cfg(feature = "stores")]
pub mod logs;
#[cfg(feature = "stores")]
pub(crate) mod net;
#[cfg(feature = "stores")]
pub mod pki;
pub mod poll;
#[cfg(feature = "stores")]
pub(crate) mod process;
#[cfg(feature = "stores")]
pub mod proxy;
#[cfg(feature = "stores")]
pub mod secrets;
#[cfg(feature = "stores")]
pub mod stores;
pub mod usage;

pub use env::{scaled, time_scale};
/// Whether a store's failed start was a port clash: another process took a
/// port between its choice and the bind (start again on other ports).
#[cfg(feature = "stores")]
pub use net::port_clash;
pub use poll::{eventually, until};
