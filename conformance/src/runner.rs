//! Running cases: each in its own task with a time limit, against a factory,
//! one at a time or four at once.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::{Case, CaseReport, Ctx, Factory, Failure, Outcome, Report, TakerCommand};

/// Every case of the suite.
pub static CASES: &[Case] = crate::__for_each_case!(__case_table());

/// Runs one case against `factory`, with a time limit of 120 s (scaled).
/// Cross-process cases skip: use [`run_case_with`] to give them a taker.
pub async fn run_case(case: &Case, factory: Arc<dyn Factory>) -> CaseReport {
    run_case_with(case, factory, None).await
}

/// [`run_case`] with a way to start lock-taker processes (what `suite!`
/// tests pass; see the `taker` module, feature `stores`).
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
