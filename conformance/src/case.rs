//! What a case is: a name, its group and the function that runs it.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::{CaseResult, Ctx};

/// One conformance case.
#[derive(Clone, Copy)]
pub struct Case {
    /// Unique name, also the name of the generated `#[test]`.
    pub name: &'static str,
    /// The module it lives in (`exclusion`, `expiry`, `concurrency`...).
    pub group: &'static str,
    /// Runs it.
    pub run: fn(Arc<Ctx>) -> BoxFuture<'static, CaseResult>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Case({}::{})", self.group, self.name)
    }
}
