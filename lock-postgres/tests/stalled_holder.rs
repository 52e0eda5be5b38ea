//! A holder that stops renewing while it keeps its connections open (a
//! paused process, or a connection hung in the network) still holds the
//! turnstile of its name: waiters queued behind it must get the lock when
//! its lease expires on the server, within TTL + the declared expiry slack
//! + a round trip, not a whole re-check interval later.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::proxy::{FaultProxy, Mode};
use lock_conformance::stores::postgres;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lockcore::backend::{LockBackendExt, WaitPolicy};
use lockcore::{Lease, LockBackend, LockName, Locker};
use tokio::time::Instant;

fn scale() -> f64 {
    std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0)
}

fn lock_name(s: &str) -> LockName {
    LockName::new(format!(
        "stalled/{}/{s}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ))
    .unwrap()
}

fn with_app(url: &str, app: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={app}")
}

/// A round-trip allowance as the conformance suite computes it: four times
/// the slowest of three `inspect` calls, plus 100 ms, scaled.
async fn round_trip(client: &PostgresBackend) -> Duration {
    let probe = lock_name("round-trip");
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let sent = Instant::now();
        client.inspect(&probe).await.unwrap();
        slowest = slowest.max(sent.elapsed());
    }
    (slowest * 4 + Duration::from_millis(100)).mul_f64(scale())
}

/// `holder` takes `name` with a waiting `acquire` (so its lease keeps the
/// turnstile) and never renews it; `stall` then freezes it (or does
/// nothing: a holder that just stops renewing, as a paused process does).
/// A waiting `acquire` of another instance must get the lock within TTL +
/// slack + a round trip of the holder's grant.
async fn waiter_gets_the_lock_at_expiry(holder: &PostgresBackend, stall: impl FnOnce()) {
    let url = postgres::shared().url();
    let app = format!(
        "stalled-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let waiter = PostgresBackend::connect(&with_app(&url, &app))
        .await
        .unwrap();
    let name = lock_name("name");
    let ttl = Duration::from_secs(1).mul_f64(scale());
    let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(30));
    let lease: Lease = holder
        .acquire_for(&name, ttl, &wait)
        .await
        .unwrap()
        .expect("the free lock");
    let expires = lease.issued_at() + ttl;
    stall();

    // The waiter queues behind the holder's turnstile, as a new user's
    // Locker does (default re-check interval).
    let locker = Locker::new(waiter.clone())
        .ttl(Duration::from_secs(30))
        .max_wait(Duration::from_secs(30));
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move { (locker.acquire(&name).await, Instant::now()) })
    };
    let mut observer = PgConnection::connect(&url).await.unwrap();
    let queued_in_time = tokio::time::timeout(ttl / 2, async {
        loop {
            let queued: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event = 'advisory'",
            )
            .bind(&app)
            .fetch_one(&mut observer)
            .await
            .unwrap();
            if queued == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        queued_in_time.is_ok(),
        "the waiter must queue at the turnstile well before the holder's expiry"
    );

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
/// stays open, idle in its transaction.
#[tokio::test]
async fn waiter_behind_a_paused_holder_gets_the_lock_at_expiry() {
    let holder = PostgresBackend::connect(&postgres::shared().url())
        .await
        .unwrap();
    waiter_gets_the_lock_at_expiry(&holder, || {}).await;
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
    waiter_gets_the_lock_at_expiry(&holder, move || frozen.set(Mode::Freeze)).await;
    proxy.set(Mode::Pass);
}
