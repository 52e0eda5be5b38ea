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
//! `stores` launches Redis, PostgreSQL, etcd and ZooKeeper as child processes
//! (or uses servers named by `LOCK_TEST_*` variables), `proxy` is a TCP fault
//! proxy, and `taker` a lock-holding helper process. An adapter's whole suite,
//! fault cases included, is then:
//!
//! ```ignore
//! use lock_conformance::stores::redis;
//! lock_conformance::suite!(redis::factory(|url| async move { MyBackend::connect(&url).await }));
//! ```
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
//! - **processes, faults** (T2.6, T3): a holder process killed or paused
//!   (the GC pause), the holder partitioned, slowed or reset by a fault proxy,
//!   the store killed and restarted or paused. They need the `stores`
//!   feature and a factory that exposes its store (the factories in
//!   the `stores` module do); otherwise they skip, saying why.
//!
//! Every case is a plain `async fn(&Ctx) -> CaseResult` in [`cases`]; the
//! suite's own tests run each one against deliberately broken backends to
//! show it fails when it should.

#![warn(missing_docs, missing_debug_implementations)]

#[cfg(feature = "stores")]
#[doc(hidden)]
pub mod broken;
mod case;
pub mod cases;
mod control;
mod ctx;
mod factory;
pub mod history;
#[cfg(feature = "stores")]
pub mod proxy;
#[cfg(feature = "stores")]
pub mod stores;
#[cfg(feature = "stores")]
pub mod taker;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

pub use case::{Case, CaseResult, Failure, Outcome};
pub use control::StoreControl;
pub use ctx::{Ctx, TakerCommand};
pub use factory::{Factory, FnFactory, SharedFactory, from_fn, shared};

#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    (() $($group:ident :: $case:ident),* $(,)?) => {
        &[$(
            $crate::Case {
                name: stringify!($case),
                group: stringify!($group),
                run: |cx| ::std::boxed::Box::pin(async move { $crate::cases::$group::$case(&cx).await }),
            }
        ),*]
    };
}

/// Every case of the suite.
pub static CASES: &[Case] = __for_each_case!(__case_table());

/// Generates one `#[test]` per conformance case, each running against the
/// factory `$factory` (an expression evaluated inside the test's runtime;
/// `.await` allowed). Cases listed in `skip = [..]` are left out, loudly.
/// Cases listed in `expect_skips = [..]` are the ones this backend cannot
/// run (each still prints its `SKIP name: why` line); any other skip fails
/// its test, and so does a listed case that passes.
///
/// ```ignore
/// lock_conformance::suite!(lock_conformance::shared(lockcore::MemoryBackend::new()));
/// lock_conformance::suite!(my_store::factory().await, skip = [every_waiter_is_served]);
/// lock_conformance::suite!(my_store::factory().await, expect_skips = [server_clock_steps_are_judged_on_the_server]);
/// ```
#[macro_export]
macro_rules! suite {
    ($factory:expr
        $(, skip = [$($skip:ident),* $(,)?])?
        $(, expect_skips = [$($expected:ident),* $(,)?])?
        $(,)?) => {
        $crate::__for_each_case! { __suite_tests ($factory; [$($($skip),*)?]; [$($($expected),*)?]) }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    (($factory:expr; [$($skip:ident),*]; [$($expected:ident),*]) $($group:ident :: $case:ident),* $(,)?) => {
        const __LOCK_CONFORMANCE_SKIP: &[&str] = &[$(stringify!($skip)),*];
        const __LOCK_CONFORMANCE_EXPECT_SKIPS: &[&str] = &[$(stringify!($expected)),*];
        $(
            #[test]
            fn $case() {
                $crate::__private::run_test(
                    stringify!($case),
                    __LOCK_CONFORMANCE_SKIP,
                    __LOCK_CONFORMANCE_EXPECT_SKIPS,
                    module_path!(),
                    || async { $factory },
                );
            }
        )*

        /// Not a test: the lock-taker helper process the cross-process cases
        /// start by re-running this binary (see `lock_conformance::taker`).
        #[test]
        #[ignore = "helper process for cross-process cases, run by the suite itself"]
        fn lock_taker_process() {
            $crate::__private::taker_main(|| async { $factory });
        }
    };
}

/// The variable naming cases expected to skip in this environment, on top of
/// a `suite!` invocation's `expect_skips` (comma- or space-separated case
/// names). CI sets it when the suite runs against stores it did not start:
/// the cases that kill, pause, restart or step the clock of a store of their
/// own ([`cases::PRIVATE_STORE_CASES`]) skip there.
pub const EXPECT_SKIPS_ENV: &str = "LOCK_TEST_EXPECT_SKIPS";

/// How one case went.
#[derive(Debug)]
pub struct CaseReport {
    /// The case.
    pub name: &'static str,
    /// Its group.
    pub group: &'static str,
    /// Passed, skipped (with the reason) or failed (with the evidence).
    pub result: CaseResult,
    /// How long it took.
    pub elapsed: Duration,
}

/// The outcome of a run.
#[derive(Debug, Default)]
pub struct Report {
    /// One entry per case run, in suite order.
    pub cases: Vec<CaseReport>,
}

impl Report {
    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|c| c.result.is_err())
    }

    /// The skipped cases.
    pub fn skipped(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases
            .iter()
            .filter(|c| matches!(c.result, Ok(Outcome::Skipped(_))))
    }

    /// Panics with the whole report unless every case passed or was skipped.
    pub fn assert_passed(&self) {
        assert!(
            self.failures().next().is_none(),
            "conformance failures:\n{self}"
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for case in &self.cases {
            let (verdict, detail) = match &case.result {
                Ok(Outcome::Passed) => ("PASS", String::new()),
                Ok(Outcome::Skipped(why)) => ("SKIP", format!(": {why}")),
                Err(failure) => ("FAIL", format!(": {failure}")),
            };
            writeln!(
                f,
                "{verdict} {}::{} ({:.1?}){detail}",
                case.group, case.name, case.elapsed
            )?;
        }
        let failed = self.failures().count();
        let skipped = self.skipped().count();
        write!(
            f,
            "{} passed, {skipped} skipped, {failed} failed",
            self.cases.len() - failed - skipped
        )
    }
}

/// Runs one case against `factory`, with a time limit of 120 s (scaled).
/// Cross-process cases skip: use [`run_case_with`] to give them a taker.
pub async fn run_case(case: &Case, factory: Arc<dyn Factory>) -> CaseReport {
    run_case_with(case, factory, None).await
}

/// [`run_case`] with a way to start lock-taker processes (what `suite!`
/// tests pass; see [`taker`]).
pub async fn run_case_with(
    case: &Case,
    factory: Arc<dyn Factory>,
    taker: Option<TakerCommand>,
) -> CaseReport {
    let started = Instant::now();
    let ctx = match factory.skip_all() {
        Some(why) => Err(Ok(Outcome::Skipped(why))),
        None => Ctx::new(factory, case.name).await.map_err(Err),
    };
    let result = match ctx {
        Err(result) => result,
        Ok(cx) => {
            let cx = cx.with_taker(taker);
            let cx = Arc::new(cx);
            let limit = cx.scaled(Duration::from_secs(120));
            match tokio::spawn(tokio::time::timeout(limit, (case.run)(cx))).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(Failure::new(format!(
                    "the case did not finish within {limit:?}"
                ))),
                Err(join) => Err(Failure::new(format!("the case panicked: {join}"))),
            }
        }
    };
    CaseReport {
        name: case.name,
        group: case.group,
        result,
        elapsed: started.elapsed(),
    }
}

/// Runs the cases `select` picks, four at a time.
pub async fn run_cases(factory: impl Factory, select: impl Fn(&Case) -> bool) -> Report {
    let factory: Arc<dyn Factory> = Arc::new(factory);
    let mut cases: Vec<CaseReport> = futures::stream::iter(CASES.iter().filter(|c| select(c)))
        .map(|case| run_case(case, factory.clone()))
        .buffer_unordered(4)
        .collect()
        .await;
    cases.sort_by_key(|c| CASES.iter().position(|k| k.name == c.name));
    Report { cases }
}

/// Runs the whole suite against `factory`.
pub async fn run_all(factory: impl Factory) -> Report {
    run_cases(factory, |_| true).await
}

#[doc(hidden)]
pub mod __private {
    use std::future::Future;
    use std::sync::Arc;

    use crate::{CASES, Factory, Outcome, TakerCommand, run_case_with};

    /// The body of every test `suite!` generates. `module` is the
    /// `module_path!()` of the invocation, to name the taker test.
    pub fn run_test<F, Fut>(
        name: &str,
        skip: &[&str],
        expect_skips: &[&str],
        module: &str,
        make: impl FnOnce() -> Fut,
    ) where
        F: Factory,
        Fut: Future<Output = F>,
    {
        let from_env = std::env::var(crate::EXPECT_SKIPS_ENV).unwrap_or_default();
        let from_env: Vec<&str> = from_env
            .split([',', ' ', '\n', '\t'])
            .filter(|s| !s.is_empty())
            .collect();
        for listed in skip.iter().chain(expect_skips).chain(&from_env) {
            assert!(
                CASES.iter().any(|c| c.name == *listed),
                "`{listed}` (in suite!'s skip or expect_skips, or {}) is not a conformance case",
                crate::EXPECT_SKIPS_ENV
            );
        }
        if skip.contains(&name) {
            say(&format!("SKIP {name}: left out by the suite! invocation"));
            return;
        }
        let case = CASES
            .iter()
            .find(|c| c.name == name)
            .expect("suite! only generates known cases");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let taker = std::env::current_exe().ok().map(|exe| TakerCommand {
            exe,
            test: taker_test_name(module),
        });
        let report = runtime.block_on(async {
            let factory = make().await;
            // A store missing in an explicitly partial local run: every case
            // skips, loudly, whatever the lists say.
            if let Some(why) = factory.skip_all() {
                return Err(why);
            }
            Ok(run_case_with(case, Arc::new(factory), taker).await)
        });
        let report = match report {
            Ok(report) => report,
            Err(why) => return say(&format!("SKIP {name}: {why}")),
        };
        let expected = expect_skips.contains(&name) || from_env.contains(&name);
        match report.result {
            Ok(Outcome::Passed) if expected => panic!(
                "{}::{name} was expected to skip but ran and passed: take it off suite!'s \
                 expect_skips (or {}) so the list of skips stays exact",
                case.group,
                crate::EXPECT_SKIPS_ENV
            ),
            Ok(Outcome::Passed) => {}
            Ok(Outcome::Skipped(why)) => {
                say(&format!("SKIP {name}: {why}"));
                assert!(
                    expected,
                    "{}::{name} skipped, and this backend does not expect it to: {why}\n\
                     If it cannot run here, declare it once: suite!(factory, expect_skips = [{name}, ..]) \
                     (or, for this environment only, {}={name})",
                    case.group,
                    crate::EXPECT_SKIPS_ENV
                );
            }
            Err(failure) => panic!(
                "{}::{name} failed after {:.1?}: {failure}",
                case.group, report.elapsed
            ),
        }
    }

    /// Writes a line to stderr past libtest's output capture, so a skipped
    /// case is seen in every run, not only in failing ones.
    fn say(line: &str) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
    }

    /// The libtest name of the taker test: the invocation's module path
    /// without the crate name.
    fn taker_test_name(module: &str) -> String {
        match module.split_once("::") {
            Some((_, path)) => format!("{path}::lock_taker_process"),
            None => "lock_taker_process".to_owned(),
        }
    }

    /// The body of the `lock_taker_process` helper test: serves the taker
    /// protocol when started by the suite, does nothing otherwise.
    pub fn taker_main<F, Fut>(make: impl FnOnce() -> Fut)
    where
        F: Factory,
        Fut: Future<Output = F>,
    {
        #[cfg(feature = "stores")]
        {
            if std::env::var(crate::taker::TAKER_ENV).as_deref() != Ok("1") {
                eprintln!(
                    "lock_taker_process: helper process, started by the cross-process cases; nothing to do"
                );
                return;
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a tokio runtime");
            runtime.block_on(async {
                let factory = make().await;
                let via = std::env::var(crate::taker::TAKER_VIA_ENV)
                    .ok()
                    .and_then(|v| v.parse::<std::net::SocketAddr>().ok());
                let client = match via {
                    Some(addr) => factory.client_via(addr).await.unwrap_or_else(|| {
                        Err(lockcore::LockError::config(
                            "the factory cannot connect through a proxy",
                        ))
                    }),
                    None => factory.client().await,
                };
                match client {
                    Ok(client) => crate::taker::serve(client).await,
                    Err(e) => println!(
                        "TAKER error cannot connect: {}",
                        e.to_string().replace('\n', " ")
                    ),
                }
            });
        }
        #[cfg(not(feature = "stores"))]
        {
            let _ = make;
            eprintln!(
                "lock_taker_process: needs lock-conformance's `stores` feature; nothing to do"
            );
        }
    }
}
