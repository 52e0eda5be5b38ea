//! What a run of the suite reports: one line per case, and the totals.

use std::fmt;
use std::time::Duration;

use crate::{CaseResult, Outcome};

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

    /// Panics unless exactly the cases of `expected` ran and each failed
    /// saying the text paired with it (or one of its alternatives, ` || `
    /// between them: a case may catch a flaw at one check or, on a loaded
    /// machine, at the next). How a deliberately broken backend proves
    /// that the cases catch its flaw for the right reason.
    pub fn assert_failed_saying(&self, expected: &[(&str, &str)]) {
        assert_eq!(
            self.cases.len(),
            expected.len(),
            "unknown case name in {expected:?}:\n{self}"
        );
        for case in &self.cases {
            let why = expected
                .iter()
                .find(|(name, _)| *name == case.name)
                .map_or("", |(_, why)| *why);
            assert!(
                matches!(&case.result, Err(failure)
                    if why.split(" || ").any(|w| failure.0.contains(w))),
                "case {} should fail saying `{why}`, but {:?}\n{self}",
                case.name,
                case.result
            );
        }
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
