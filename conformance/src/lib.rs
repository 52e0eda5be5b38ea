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
//! [`run_all`] runs every case in one call and returns a [`Report`], for
//! custom harnesses.
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
//!
//! Every case is a plain `async fn(&Ctx) -> CaseResult` in [`cases`]; the
//! suite's own tests run each one against deliberately broken backends to
//! show it fails when it should.

#![warn(missing_docs, missing_debug_implementations)]

mod case;
pub mod cases;
mod control;
mod ctx;
mod factory;
pub mod history;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

pub use case::{Case, CaseResult, Failure, Outcome};
pub use control::StoreControl;
pub use ctx::Ctx;
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
///
/// ```ignore
/// lock_conformance::suite!(lock_conformance::shared(lockcore::MemoryBackend::new()));
/// lock_conformance::suite!(my_store::factory().await, skip = [every_waiter_is_served]);
/// ```
#[macro_export]
macro_rules! suite {
    ($factory:expr $(, skip = [$($skip:ident),* $(,)?])? $(,)?) => {
        $crate::__for_each_case! { __suite_tests ($factory; [$($($skip),*)?]) }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    (($factory:expr; [$($skip:ident),*]) $($group:ident :: $case:ident),* $(,)?) => {
        const __LOCK_CONFORMANCE_SKIP: &[&str] = &[$(stringify!($skip)),*];
        $(
            #[test]
            fn $case() {
                $crate::__private::run_test(stringify!($case), __LOCK_CONFORMANCE_SKIP, || async { $factory });
            }
        )*
    };
}

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
pub async fn run_case(case: &Case, factory: Arc<dyn Factory>) -> CaseReport {
    let started = Instant::now();
    let result = match Ctx::new(factory, case.name).await {
        Err(failure) => Err(failure),
        Ok(cx) => {
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

    use crate::{CASES, Factory, Outcome, run_case};

    /// The body of every test `suite!` generates.
    pub fn run_test<F, Fut>(name: &str, skip: &[&str], make: impl FnOnce() -> Fut)
    where
        F: Factory,
        Fut: Future<Output = F>,
    {
        if skip.contains(&name) {
            eprintln!("{name}: left out by the suite! invocation");
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
        let report = runtime.block_on(async {
            let factory = make().await;
            run_case(case, Arc::new(factory)).await
        });
        match report.result {
            Ok(Outcome::Passed) => {}
            Ok(Outcome::Skipped(why)) => eprintln!("{name}: skipped: {why}"),
            Err(failure) => panic!(
                "{}::{name} failed after {:.1?}: {failure}",
                case.group, report.elapsed
            ),
        }
    }
}
