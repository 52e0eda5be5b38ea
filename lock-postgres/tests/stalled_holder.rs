//! A holder that stops renewing while it keeps its connections open (a
//! paused process, or a connection hung in the network): waiters must get
//! the lock when its lease expires on the server, within TTL + the declared
//! expiry slack + a round trip, not a whole re-check interval later. Both
//! when its lease keeps the name's turnstile (it was let in by the line,
//! so the next waiter is queued behind it) and when it does not (it took
//! a free lock nobody waited for, so the next waiter holds the turnstile).
//!
//! A test binary of its own, apart from the store binary's cases.

#[path = "store/support.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use crate::support::{acquired, lock_name, round_trip, scaled, with_app};
use lock_conformance::kit::poll::until;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::postgres;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, PgPool};
use lock_postgres::testing;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Lease, LockBackend, Locker};
use tokio::time::Instant;

/// `holder` takes `name` with a waiting `acquire` and never renews it;
/// `stall` then freezes it (or does nothing: a holder that just stops
/// renewing, as a paused process does). With `through_line`, somebody
/// holds the name first, so `holder` waits in line and its lease keeps the
/// turnstile. A waiting `acquire` of another instance must get the lock
/// within TTL + slack + a round trip of the holder's grant.
async fn waiter_gets_the_lock_at_expiry(
    holder: &PostgresBackend,
    through_line: bool,
    stall: impl FnOnce(),
) {
    let url = postgres::shared().url();
    let app = format!(
        "stalled-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let waiter = PostgresBackend::connect(&with_app(&url, &app))
        .await
        .unwrap();
    let name = lock_name("name");
    // Long enough that the waiter is surely in line by half of it (a new
    // connection and a query under load), short enough to keep the case quick.
    let ttl = scaled(Duration::from_secs(3));
    let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(30));
    let lease: Lease = if through_line {
        let first = acquired(&waiter, &name, Duration::from_secs(30)).await;
        let queued = {
            let (holder, name, wait) = (holder.clone(), name.clone(), wait.clone());
            tokio::spawn(async move { holder.acquire_for(&name, ttl, &wait).await })
        };
        until(Duration::from_secs(10), "the holder in line", || async {
            testing::waiting(holder) == 1
        })
        .await;
        waiter.release(&first).await.unwrap();
        queued.await.unwrap().unwrap().expect("let in by the line")
    } else {
        holder
            .acquire_for(&name, ttl, &wait)
            .await
            .unwrap()
            .expect("the free lock")
    };
    let expires = lease.issued().mono() + ttl;
    stall();

    // The waiter waits as a new user's Locker does (default re-check
    // interval): queued behind the holder's turnstile, or holding it.
    let locker = Locker::new(waiter.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(30));
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move { (locker.acquire(&name).await, Instant::now()) })
    };
    let observer = PgPool::connect(&url).await.unwrap();
    // At the turnstile: queued on it (waiting on the advisory lock), or
    // holding it (the session idle after its queued statement returned:
    // `distlock_turn`, or a plain `pg_advisory_lock`).
    // Behind a holder let in by the line the waiter is usually queued; but
    // under load the holder's grant sometimes came from a plain attempt,
    // which keeps no turnstile (its session's last statement was the
    // acquire, no advisory lock held), and the waiter then holds the
    // turnstile, as behind a lone holder (the second case below).
    let in_line = "SELECT count(*) FROM pg_stat_activity
          WHERE application_name = $1 AND (query LIKE '%distlock_turn(%' OR query LIKE '%pg_advisory_lock(%')
            AND (wait_event = 'advisory' OR state = 'idle')";
    until(
        ttl / 2,
        "the waiter in line well before the holder's expiry",
        || async {
            let turnstiles: i64 = sqlx::query_scalar(in_line)
                .bind(&app)
                .fetch_one(&observer)
                .await
                .unwrap();
            turnstiles == 1
        },
    )
    .await;

    let (guard, granted) = waiting.await.unwrap();
    let guard = guard.expect("the waiter gets the lock");
    let late = granted.saturating_duration_since(expires);
    let bound = waiter.capabilities().expiry_slack + round_trip(&waiter).await;
    eprintln!("granted {late:?} after the holder's expiry (bound {bound:?})");
    assert!(granted >= expires, "granted before the holder's expiry");
    assert!(
        late <= bound,
        "granted {late:?} after the holder's expiry; bound: declared slack + a round trip = {bound:?}"
    );
    assert!(guard.fencing_token() > lease.fence());
    guard.release().await.unwrap();
    drop(lease);
}

/// The holder stops renewing (a paused process): its turnstile connection
/// stays open, holding the turnstile.
#[tokio::test]
async fn waiter_behind_a_paused_holder_gets_the_lock_at_expiry() {
    let holder = PostgresBackend::connect(&postgres::shared().url())
        .await
        .unwrap();
    waiter_gets_the_lock_at_expiry(&holder, true, || {}).await;
}

/// The same with a holder that took a free lock nobody waited for: the
/// waiter holds the turnstile and retries at the holder's expiry.
#[tokio::test]
async fn waiter_holding_the_turnstile_gets_the_lock_at_expiry() {
    let holder = PostgresBackend::connect(&postgres::shared().url())
        .await
        .unwrap();
    waiter_gets_the_lock_at_expiry(&holder, false, || {}).await;
}

/// The holder's connections hang mid-hold (frozen in the network: no
/// reply, no reset).
#[tokio::test]
async fn waiter_behind_a_hung_holder_gets_the_lock_at_expiry() {
    let store = postgres::shared();
    let proxy = Arc::new(FaultProxy::start(store.addr()).await.unwrap());
    let holder = PostgresBackend::connect(&store.url_via(proxy.addr()))
        .await
        .unwrap();
    let frozen = proxy.clone();
    waiter_gets_the_lock_at_expiry(&holder, true, move || frozen.set(Mode::Freeze)).await;
    proxy.set(Mode::Pass);
}
