//! The bodies of the tests `suite!` generates: run one case with the skip
//! lists applied (the invocation's and the environment's), and serve the
//! lock-taker protocol in the helper test. Reached through
//! `lock_conformance::__private`, for the macros only.

use std::future::Future;
use std::sync::{Arc, RwLock};

use crate::{CASES, Factory, Outcome, TakerCommand, run_case_with};

/// The cases that raise the store's fence floor run alone: a raise is an
/// operator's action on the whole store (after a restore), and a backend
/// may send the waiters queued before it to the back of the line rather
/// than grant them a fence under it; a case about FIFO order running
/// beside it would see that.
static FLOOR_RAISES: RwLock<()> = RwLock::new(());

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
    #[cfg(feature = "stores")]
    crate::kit::logs::to_stderr_from_env();
    let from_env = crate::kit::env::expect_skips();
    let from_env: Vec<&str> = from_env.iter().map(String::as_str).collect();
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
    let _floor = if name.starts_with("fence_floor") {
        Err(FLOOR_RAISES.write().unwrap_or_else(|p| p.into_inner()))
    } else {
        Ok(FLOOR_RAISES.read().unwrap_or_else(|p| p.into_inner()))
    };
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
        eprintln!("lock_taker_process: needs lock-conformance's `stores` feature; nothing to do");
    }
}
