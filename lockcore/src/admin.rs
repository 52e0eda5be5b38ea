//! Administrative actions, audited once here for every backend.

use crate::audit::{self, ForcedRelease, Stage};
use crate::{FencingToken, Holder, LockBackend, LockError, LockName};

/// Evicts whoever holds `name` (or, with `expected`, only the holder with
/// that fence), makes the next grant's fence larger, and records the action:
/// one [`audit`] event before the request and one with its outcome.
///
/// Returns the evicted holder, or `None` when nothing was evicted. Between
/// the eviction and the moment the evicted holder notices
/// ([`Capabilities::eviction_notice`](crate::Capabilities::eviction_notice)),
/// only fencing protects the resource.
///
/// # Errors
/// A store error; the outcome is then unknown (and audited as such). Retry
/// with `expected` set to the fence you saw, so the retry cannot evict the
/// next, legitimate holder.
pub async fn force_release(
    backend: &dyn LockBackend,
    name: &LockName,
    reason: &str,
    expected: Option<FencingToken>,
) -> Result<Option<Holder>, LockError> {
    let request = ForcedRelease::requested(
        backend.capabilities().backend,
        name.clone(),
        expected,
        reason,
    );
    audit::emit(request.clone());
    let outcome = backend.evict(name, expected).await;
    let tags = crate::metrics::Tags::new(request.backend, None);
    crate::metrics::forced_release(&tags, outcome.as_ref().ok().map(Option::is_some));
    if let Err(e) = &outcome {
        crate::metrics::store_error(&tags, e);
    }
    audit::emit(request.then(match &outcome {
        Ok(Some(holder)) => Stage::Evicted(holder.clone()),
        Ok(None) => Stage::NothingEvicted,
        Err(e) => Stage::Unknown(e.to_string()),
    }));
    outcome
}

/// Raises the fence floor (see
/// [`LockBackend::raise_fence_floor`]):
/// every fence handed out from now on is larger than `floor`. The step after
/// restoring a store from a backup, recorded as a WARN event on target
/// `distlock::audit`.
///
/// # Errors
/// [`LockError::InvalidConfig`] for a floor the store could not count past
/// ([`Capabilities::check_fence_floor`](crate::Capabilities::check_fence_floor)),
/// before any I/O; [`LockError::Unsupported`] where the backend has no
/// floor; a store error.
pub async fn raise_fence_floor(
    backend: &dyn LockBackend,
    floor: FencingToken,
) -> Result<(), LockError> {
    backend.capabilities().check_fence_floor(floor)?;
    let outcome = backend.raise_fence_floor(floor).await;
    tracing::warn!(
        target: "distlock::audit",
        backend = backend.capabilities().backend,
        floor = floor.get(),
        ok = outcome.is_ok(),
        "fence floor raised"
    );
    outcome
}
