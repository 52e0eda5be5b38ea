//! The distlock conformance suite: one set of behaviour tests that every lock
//! backend must pass, against its real store.
//!
//! # Running it
//!
//! For a backend author, one line in `tests/conformance.rs` generates one
//! `#[test]` per case:
//!
//! ```ignore
//! lock_conformance::suite!(lock_conformance::shared(my_backend::MyBackend::new()));
//! ```
//!
//! The argument is any expression (evaluated inside the test's tokio
//! runtime, so `.await` is allowed) that yields a [`Factory`]: something
//! that hands out independent clients of one store. Cases that do not apply
//! to a backend (say, per-lock expiry on a session-based store) are skipped
//! by its [`Capabilities`](lockcore::Capabilities) and print why; cases you
//! want to leave out on purpose go in `suite!(factory, skip = [case, ...])`.
//!
//! Skips are part of what a backend declares: every case that skips on it
//! is listed once, in `suite!(factory, expect_skips = [case, ...])`. A case
//! that skips without being listed fails its test (so skips cannot grow
//! silently), and so does a listed case that ran and passed (so the list
//! stays exact). An environment that rules out more cases, such as CI
//! against stores the suite did not start and may not kill, names them in
//! [`EXPECT_SKIPS_ENV`].
//!
//! [`run_all`] runs every case in one call and returns a [`Report`], for
//! custom harnesses (without lock-taker processes: the cross-process cases
//! skip there).
//!
//! # Real stores and faults (feature `stores`)
//!
//! The test [`kit`] launches Redis, PostgreSQL, etcd and ZooKeeper as child
//! processes (or uses servers named by `LOCK_TEST_<STORE>_URL`), puts a TCP
//! fault proxy in front of them, and waits for conditions; `stores` has a
//! conformance factory per store, and `taker` a lock-holding helper process.
//! An adapter's whole suite, fault cases included, is then:
//!
//! ```ignore
//! use lock_conformance::kit::stores::redis;
//! lock_conformance::suite!(
//!     lock_conformance::StoreFactory::redis(|url| async move { MyBackend::connect(&url).await }),
//!     expect_skips = [server_clock_steps_are_judged_on_the_server],
//! );
//! ```
//!
//! (redis-server cannot run under libfaketime, so the clock-step case
//! skips there and is listed.)
//!
//! `suite!` also generates an ignored `lock_taker_process` test: the
//! cross-process cases re-run the test binary as that test to get a real,
//! separate lock holder they can `kill -9` or `SIGSTOP`.
//!
//! # What it checks
//!
//! - **exclusion, release, renewal, expiry, fencing, waiting, loss, admin**
//!   (T1): one holder per name, owner-checked and idempotent release and
//!   renew, expiry on the store's clock never before the holder's deadline,
//!   strictly increasing fences, acquire timeouts within bounds, wake-ups on
//!   release, cancellation that leaves nothing behind, the guard's loss
//!   signal, forced release with one audit event, truthful TTLs.
//! - **concurrency** (T2): a fenced lost-update counter under 16 clients,
//!   and a random workload whose history is checked for fence order, overlap
//!   and refused valid writes ([`history`]).
//! - **bad_input** (T4): invalid names, TTLs and waits are typed errors; odd
//!   valid names (paths, globs, SQL, unicode, 255 bytes) are distinct locks.
//! - **labels, hold caps, wake-ups, semaphores, elections, fence floor**:
//!   labels shown by `inspect` and never deciding ownership,
//!   `Locker::max_hold`, `watch`/`watch_permits` wake-ups, at most N permit
//!   holders with per-slot fences, one leader at a time with increasing
//!   terms, and every grant above a raised fence floor.
//! - **processes, faults, clock, nemesis** (T2.6, T3): a holder process
//!   killed or paused (the GC pause), the holder partitioned, slowed or
//!   reset by a fault proxy, the store killed and restarted or paused, the
//!   store's clock stepped (checked against the declared `expiry_clock`),
//!   and a seeded nemesis over many clients' links. They need the `stores`
//!   feature and a factory that exposes its store (the factories in the
//!   `stores` module do); otherwise they skip, saying why: list them in
//!   `expect_skips` (`tests/memory.rs` does, for the reference backend).
//!
//! Every case is a plain `async fn(&Ctx) -> CaseResult` in [`cases`]; the
//! suite's own tests run each one against deliberately broken backends to
//! show it fails when it should.

#[cfg(feature = "stores")]
#[doc(hidden)]
pub mod broken;
mod case;
pub mod cases;
#[cfg(feature = "stores")]
mod cluster_factory;
mod control;
mod ctx;
mod factory;
mod harness;
pub mod history;
pub mod kit;
mod macros;
mod outcome;
mod report;
mod runner;
#[cfg(feature = "stores")]
mod store_factory;
#[cfg(feature = "stores")]
pub mod taker;

pub use case::Case;
pub use control::StoreControl;
pub use ctx::{Ctx, TakerCommand};
pub use factory::{Factory, FnFactory, SharedFactory, from_fn, shared};
pub use outcome::{CaseResult, Failure, Outcome};
pub use report::{CaseReport, Report};
pub use runner::{CASES, run_all, run_case, run_case_with, run_cases};

#[cfg(feature = "stores")]
pub use cluster_factory::{ClusterFactory, redis_cluster};
#[cfg(feature = "stores")]
pub use store_factory::StoreFactory;

/// The variable naming cases expected to skip in this environment, on top of
/// a `suite!` invocation's `expect_skips` (comma- or space-separated case
/// names). CI sets it when the suite runs against stores it did not start:
/// the cases that kill, pause, restart or step the clock of a store of their
/// own ([`cases::PRIVATE_STORE_CASES`]) skip there.
pub const EXPECT_SKIPS_ENV: &str = kit::env::EXPECT_SKIPS.name();

/// What the tests `suite!` generates call; not an API.
#[doc(hidden)]
pub mod __private {
    pub use crate::harness::{run_test, taker_main};
}
