//! What the fault cases share: their TTL and timer slack, a client behind a
//! fault proxy, contenders that poll or wait for a name, and the checks of
//! a takeover and of a silent holder's loss.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{
    Attempt, FencedResource, Lease, LockBackend, LockError, LockGuard, LockName, Locker,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::history::History;
use crate::kit::proxy::FaultProxy;
use crate::{Ctx, Failure, ensure};

/// A TTL for fault cases: at least 1 s (scaled), so a renewal interval
/// leaves room for scheduling on a loaded machine.
pub(crate) fn fault_ttl(cx: &Ctx) -> Duration {
    let want = cx.short_ttl().max(cx.scaled(Duration::from_secs(1)));
    cx.caps().effective_ttl(want).map_or(want, |t| t.get())
}

/// How late after its deadline `lost()` may be observed: timer and
/// scheduling granularity, not protocol slack. 60 ms (scaled), plus twice
/// how late a short sleep wakes now: a loaded machine delays the loss
/// signal's timer and this probe alike.
pub(crate) async fn timer_slack(cx: &Ctx) -> Duration {
    let asked = Duration::from_millis(5);
    let started = Instant::now();
    tokio::time::sleep(asked).await;
    let late = started.elapsed().saturating_sub(asked);
    cx.scaled(Duration::from_millis(60)) + late * 2
}

/// A proxy in front of the store and a client through it, or why not.
pub(crate) async fn proxied(
    cx: &Ctx,
) -> Result<Result<(FaultProxy, Arc<dyn LockBackend>), String>, Failure> {
    if let Some(why) = cx.factory().no_proxy_reason() {
        return Ok(Err(why));
    }
    let Some(store) = cx.store() else {
        return Ok(Err(
            "no store process to put a proxy in front of (Factory::store)".into(),
        ));
    };
    let proxy = FaultProxy::start_each(&store.addrs())
        .await
        .map_err(|e| Failure::new(format!("cannot start a fault proxy: {e}")))?;
    match cx.factory().client_via_each(&proxy.routes()).await {
        None => Ok(Err(
            "the factory cannot connect through a proxy (Factory::client_via)".into(),
        )),
        Some(Err(e)) => Err(Failure::new(format!(
            "cannot connect through the proxy: {e}"
        ))),
        Some(Ok(client)) => Ok(Ok((proxy, client))),
    }
}

pub(crate) fn stale_write_refused(
    resource: &FencedResource<Vec<&'static str>>,
    old: lockcore::FencingToken,
    who: &str,
) -> Result<(), Failure> {
    match resource.write(old, |v| v.push("stale")) {
        Err(_) => Ok(()),
        Ok(()) => Err(Failure::new(format!(
            "C1: {who}'s write with old fence {old} was accepted after a newer holder wrote"
        ))),
    }
}

pub(crate) fn check_history(history: &History) -> Result<(), Failure> {
    let violations = history.check();
    ensure!(
        violations.is_empty(),
        "history violations:\n{}",
        violations.join("\n")
    );
    Ok(())
}

/// What a contender got: its grant (a lease or a guard), when it sent
/// the winning request and when the reply came.
pub(crate) struct Taken<G> {
    pub(crate) grant: G,
    pub(crate) invoked: Instant,
    pub(crate) at: Instant,
}

/// A contender running in its own task: `None` when it gave up.
pub(crate) type Contender<G> = JoinHandle<Result<Option<Taken<G>>, LockError>>;

/// Contends for `name` from now until `give_up` by polling `try_acquire`
/// every `every`.
pub(crate) fn poll_for(
    client: Arc<dyn LockBackend>,
    name: LockName,
    ttl: Duration,
    every: Duration,
    give_up: Instant,
) -> Contender<Lease> {
    tokio::spawn(async move {
        loop {
            let invoked = Instant::now();
            match client.try_acquire_for(&name, ttl).await {
                Ok(Attempt::Acquired(grant)) => {
                    let at = Instant::now();
                    return Ok(Some(Taken { grant, invoked, at }));
                }
                Ok(Attempt::Held { .. }) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= give_up {
                return Ok(None);
            }
            tokio::time::sleep(every).await;
        }
    })
}

/// Contends for `name` from now until `give_up` with one waiting
/// `acquire` through `locker`.
pub(crate) fn wait_for(locker: Locker, name: LockName, give_up: Instant) -> Contender<LockGuard> {
    tokio::spawn(async move {
        let invoked = Instant::now();
        let wait = give_up.saturating_duration_since(invoked);
        match locker.acquire_timeout(&name, wait).await {
            Ok(grant) => {
                let at = Instant::now();
                Ok(Some(Taken { grant, invoked, at }))
            }
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    })
}

/// The contender's outcome, once its task ends.
pub(crate) async fn joined<G>(who: &str, task: Contender<G>) -> Result<Option<Taken<G>>, Failure> {
    task.await
        .map_err(|e| Failure::new(format!("{who}'s task failed: {e}")))?
        .map_err(|e| Failure::new(format!("{who}: unexpected error: {e} ({e:?})")))
}

/// A contender's grant against the silent holder's: never before the
/// holder's local `deadline` (S1) and, with `bound`, within `bound` of
/// `since` (L1), the last moment the store could have extended the
/// holder's lease.
pub(crate) fn check_takeover(
    who: &str,
    name: &LockName,
    granted: Option<Instant>,
    deadline: Instant,
    since: (Instant, &str),
    bound: Option<Duration>,
) -> Result<(), Failure> {
    let (from, what) = since;
    match (granted, bound) {
        (Some(at), _) if at < deadline => Err(Failure::new(format!(
            "S1: {who} was granted {name} {:?} before the silent holder's local deadline",
            deadline - at
        ))),
        (Some(at), Some(bound)) if at > from + bound => Err(Failure::new(format!(
            "L1: {who} got {name} {:?} after {what}, later than TTL + the declared expiry \
             slack + a round trip ({bound:?})",
            at - from
        ))),
        (None, Some(bound)) => Err(Failure::new(format!(
            "L1: {who} never got {name}, not even {:?} after {what} (bound {bound:?})",
            from.elapsed()
        ))),
        _ => Ok(()),
    }
}

/// Waits for a silent holder's guard to count the lease lost, by its
/// local deadline; returns when that was and the deadline.
pub(crate) async fn lost_by_deadline(
    cx: &Ctx,
    guard: &LockGuard,
    ttl: Duration,
    what: &str,
) -> Result<(Instant, Instant), Failure> {
    let reason = tokio::time::timeout(ttl + cx.slack(ttl), guard.lost())
        .await
        .map_err(|_| {
            Failure::new(format!(
                "C6: the holder's lost() did not fire within TTL + slack of {what}"
            ))
        })?;
    let fired = Instant::now();
    let deadline = guard.lease().deadline();
    let slack = timer_slack(cx).await;
    ensure!(
        fired <= deadline + slack,
        "C6: the holder's lost() ({reason}) fired {:?} after its deadline",
        fired - deadline
    );
    ensure!(!guard.is_held(), "is_held() must be false once lost");
    Ok((fired, deadline))
}
