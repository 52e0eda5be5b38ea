//! Forced release is pushed to a connected holder: its guard fires `lost()`
//! within the declared eviction notice plus a round trip, through the one
//! LISTEN connection of its backend instance, however many locks it holds;
//! and compare-and-evict only evicts the grant it names.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{round_trip, unique, with_app};
use lock_conformance::kit::stores::postgres;
use lock_postgres::PostgresBackend;
use lock_postgres::sqlx::{self, Connection, PgConnection};
use lockcore::backend::LockBackendExt;
use lockcore::{
    Attempt, FencingToken, Lease, LockBackend, LockName, Locker, LossReason, ReleaseOutcome,
};
use tokio::time::Instant;

fn prefix() -> String {
    unique("evict")
}

fn notice(client: &PostgresBackend) -> Duration {
    client
        .capabilities()
        .eviction_notice
        .expect("PostgreSQL pushes evictions to connected holders")
}

/// Twenty evictions of a guard that renews only every 10 s: each fires
/// `lost()` within the notice + a round trip. Prints the latencies.
#[tokio::test]
async fn forced_release_reaches_the_holder_within_the_notice() {
    let url = postgres::shared().url();
    let holder = PostgresBackend::connect(&url).await.unwrap();
    let admin = Locker::new(PostgresBackend::connect(&url).await.unwrap());
    let bound = notice(&holder) + round_trip(&holder).await;
    let locker = Locker::new(holder.clone())
        .ttl(Duration::from_secs(30))
        .renew_every(Duration::from_secs(10));
    let prefix = prefix();
    let mut latencies = Vec::new();
    for i in 0..20 {
        let name = LockName::new(format!("{prefix}/{i}")).unwrap();
        let guard = locker.acquire(&name).await.unwrap();
        let evicted = admin
            .force_release(&name, "test: evict")
            .await
            .unwrap()
            .expect("a holder to evict");
        assert_eq!(evicted.fence, guard.fencing_token());
        let sent = Instant::now();
        let reason = tokio::time::timeout(bound, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("eviction {i}: lost() did not fire within {bound:?}"));
        latencies.push(sent.elapsed());
        assert_eq!(reason, LossReason::StoreReported);
        assert!(!guard.is_held());
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
    }
    latencies.sort();
    eprintln!(
        "eviction notice over {} runs: min {:?}, median {:?}, max {:?} (bound {bound:?})",
        latencies.len(),
        latencies[0],
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
}

/// Compare-and-evict: a wrong fence evicts nothing and tells nobody; the
/// right one evicts that grant, tells its holder, and the next grant's
/// fence is larger.
#[tokio::test]
async fn compare_and_evict_evicts_only_the_named_grant() {
    let url = postgres::shared().url();
    let holder = PostgresBackend::connect(&url).await.unwrap();
    let admin = PostgresBackend::connect(&url).await.unwrap();
    let bound = notice(&holder) + round_trip(&holder).await;
    let name = LockName::new(format!("{}/cas", prefix())).unwrap();
    let guard = Locker::new(holder.clone())
        .ttl(Duration::from_secs(30))
        .renew_every(Duration::from_secs(10))
        .acquire(&name)
        .await
        .unwrap();
    let fence = guard.fencing_token();
    let wrong = FencingToken::new(fence.get() + 1).unwrap();
    assert_eq!(admin.evict(&name, Some(wrong)).await.unwrap(), None);
    assert!(
        tokio::time::timeout(bound, guard.lost()).await.is_err(),
        "a compare-and-evict that evicted nothing must not signal loss"
    );
    assert!(guard.is_held());
    assert_eq!(
        admin.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(fence)
    );

    let evicted = admin
        .evict(&name, Some(fence))
        .await
        .unwrap()
        .expect("the named grant is evicted");
    assert_eq!(evicted.fence, fence);
    let reason = tokio::time::timeout(bound, guard.lost())
        .await
        .expect("lost() within the notice");
    assert_eq!(reason, LossReason::StoreReported);
    assert_eq!(admin.evict(&name, Some(fence)).await.unwrap(), None);
    let next = match admin.try_acquire_for(&name, Duration::from_secs(5)).await {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("free after the eviction: {other:?}"),
    };
    assert!(next.fence() > fence);
    admin.release(&next).await.unwrap();
}

/// 10,000 held locks mean one LISTEN connection, not 10,000: the instance
/// has at most its pool and one listener open, and an eviction reaches
/// the one holder it names, and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_holders_share_one_listener() {
    const LOCKS: usize = 10_000;
    const POOL: u32 = 8;
    let url = postgres::shared().url();
    let app = format!(
        "holders-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let holder = PostgresBackend::connect(&format!("{}&pool_size={POOL}", with_app(&url, &app)))
        .await
        .unwrap();
    let admin = PostgresBackend::connect(&url).await.unwrap();
    let prefix = prefix();
    let names: Vec<LockName> = (0..LOCKS)
        .map(|i| LockName::new(format!("{prefix}/{i}")).unwrap())
        .collect();
    let mut leases: Vec<Lease> = Vec::with_capacity(LOCKS);
    for chunk in names.chunks(LOCKS / usize::try_from(POOL).unwrap()) {
        let tasks: Vec<_> = chunk
            .iter()
            .cloned()
            .map(|name| {
                let holder = holder.clone();
                tokio::spawn(async move {
                    match holder
                        .try_acquire_for(&name, Duration::from_secs(120))
                        .await
                    {
                        Ok(Attempt::Acquired(lease)) => lease,
                        other => panic!("{name}: {other:?}"),
                    }
                })
            })
            .collect();
        for task in tasks {
            leases.push(task.await.unwrap());
        }
    }
    let bound = notice(&holder) + round_trip(&admin).await;
    let mut observer = PgConnection::connect(&url).await.unwrap();
    let sessions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&mut observer)
            .await
            .unwrap();
    assert!(
        sessions <= i64::from(POOL) + 1,
        "{sessions} sessions for {LOCKS} held locks (pool {POOL} + one listener)"
    );

    let victim = &leases[LOCKS / 2];
    let lost = victim
        .loss_signal()
        .expect("held leases carry a loss signal");
    admin.evict(victim.name(), None).await.unwrap().unwrap();
    tokio::time::timeout(bound, lost.cancelled())
        .await
        .expect("the evicted holder learns within the notice");
    let others_lost = leases
        .iter()
        .filter(|l| l.loss_signal().is_some_and(|s| s.is_cancelled()))
        .count();
    assert_eq!(others_lost, 1, "only the evicted lease is lost");
    let released = Arc::new(holder.clone());
    for lease in &leases {
        released.release(lease).await.unwrap();
    }
}
