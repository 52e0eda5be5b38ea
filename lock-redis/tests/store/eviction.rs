//! A forced release reaches the holder: the force-release script publishes
//! the eviction on the prefix's eviction channel, and the holder's backend
//! instance (one subscription, however many leases) fires that lease's
//! loss signal. Also what happens when the subscription is gone or silent
//! (every lease is checked once it is back), and compare-and-evict.

use std::time::Duration;

use crate::support::{
    clients_of_type, connect_scaled, private, raw, round_trip, scaled, take, unique,
};
use futures::StreamExt;
use lock_conformance::StoreControl;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::redis::{self as launcher, Options, Persistence};
use lock_conformance::kit::until;
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{FencingToken, LockBackend, Locker, LossReason, ReleaseOutcome};
use tokio::time::Instant;

/// Longer than any test: nothing here may be noticed by a renewal.
const LONG: Duration = Duration::from_secs(120);

fn declared_notice(backend: &RedisBackend) -> Duration {
    backend
        .capabilities()
        .eviction_notice
        .expect("redis declares an eviction notice")
}

/// What `distlock run` relies on: a holder whose next renewal is 40 s away
/// hears a forced release within the declared notice plus a round trip,
/// 30 times in a row. Prints the latency distribution (from the moment the
/// eviction returned to the admin, and from before it was sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_reaches_the_holder_within_the_notice() {
    const RUNS: usize = 30;
    let url = launcher::shared().url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let admin = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let bound = declared_notice(&holder) + round_trip(&holder).await;
    let locker = Locker::new(holder).ttl(LONG);
    let (mut after_reply, mut from_send) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        let name = unique("pushed");
        let guard = locker.acquire(&name).await.unwrap();
        let sent = Instant::now();
        let evicted = admin.force_release(&name, "test: evict").await.unwrap();
        let replied = Instant::now();
        assert_eq!(evicted.map(|h| h.fence), Some(guard.fencing_token()));
        let reason = tokio::time::timeout(bound, guard.lost())
            .await
            .unwrap_or_else(|_| {
                panic!("run {run}: lost() did not fire within {bound:?} of the forced release")
            });
        let heard = Instant::now();
        assert_eq!(reason, LossReason::StoreReported, "run {run}");
        assert!(!guard.is_held());
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);
        after_reply.push(heard - replied);
        from_send.push(heard - sent);
    }
    for (what, mut latencies) in [
        ("after the eviction's reply", after_reply),
        ("from the eviction's send", from_send),
    ] {
        latencies.sort();
        println!(
            "eviction notice over {RUNS} runs, {what}: min {:?}, p50 {:?}, p90 {:?}, max {:?} (bound {bound:?})",
            latencies[0],
            latencies[RUNS / 2],
            latencies[RUNS * 9 / 10],
            latencies[RUNS - 1]
        );
    }
}

/// `evict(name, Some(fence))` evicts only the holder of that fence: a
/// wrong fence (older, newer) or a free lock changes nothing (the holder
/// keeps its lease and hears nothing, the fence counter does not move);
/// the right one evicts, tells the holder and advances the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_evict_acts_on_that_fence_only() {
    let url = launcher::shared().url();
    let holder = RedisBackend::connect(&url).await.unwrap();
    let admin = RedisBackend::connect(&url).await.unwrap();
    let name = unique("compare-and-evict");
    let fence_key = format!("distlock:{{{}}}:fence", name.as_str());
    let mut con = raw(&url).await;

    assert_eq!(
        admin
            .evict(&name, Some(FencingToken::new(1).unwrap()))
            .await
            .unwrap(),
        None,
        "a free lock is not evicted"
    );
    let untouched: Option<u64> = con.get(&fence_key).await.unwrap();
    assert_eq!(untouched, None, "and its fence counter is not created");

    let lease = take(&holder, &name, LONG).await;
    let fence = lease.fence().get();
    for wrong in [fence - 1, fence + 1] {
        let outcome = admin
            .evict(&name, Some(FencingToken::new(wrong).unwrap()))
            .await
            .unwrap();
        assert_eq!(outcome, None, "fence {wrong} is not the holder's {fence}");
    }
    let counter: u64 = con.get(&fence_key).await.unwrap();
    assert_eq!(
        counter, fence,
        "a refused eviction leaves the counter alone"
    );
    assert_eq!(
        admin.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(lease.fence()),
        "the holder still holds"
    );
    let lost = lease
        .loss_signal()
        .expect("redis leases carry a loss signal");
    assert!(!lost.is_cancelled(), "a refused eviction tells nobody");
    let renewed = holder.renew(&lease).await.expect("and can renew");

    let evicted = admin.evict(&name, Some(lease.fence())).await.unwrap();
    assert_eq!(
        evicted.map(|h| (h.fence, h.owner)),
        Some((lease.fence(), Some(lease.owner())))
    );
    let bound = declared_notice(&holder) + round_trip(&holder).await;
    tokio::time::timeout(bound, lost.cancelled())
        .await
        .expect("the evicted holder hears it");
    assert!(renewed.is_expired(), "renewed copies share the signal");
    let bumped: u64 = con.get(&fence_key).await.unwrap();
    assert!(bumped > fence, "the eviction advances the fence");
    let next = take(&admin, &name, LONG).await;
    assert!(next.fence().get() > bumped);
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    admin.release(&next).await.unwrap();
}

/// One backend holding 10,000 locks has one pub/sub connection with one
/// subscription (the eviction channel; no wake-up channel, nothing
/// waits). Evicting one lock fires that lease's signal and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_share_one_subscription() {
    const LEASES: usize = 10_000;
    let store = private(Options::default().persistence(Persistence::None)).await;
    let url = store.url();
    let holder = connect_scaled(&url).await;
    let names: Vec<_> = (0..LEASES).map(|i| unique(&format!("many-{i}"))).collect();
    // 200 in flight: enough to be quick, few enough for every reply to
    // come within the response timeout on a loaded machine.
    let leases: Vec<_> = futures::stream::iter(&names)
        .map(|n| take(&holder, n, LONG))
        .buffered(200)
        .collect()
        .await;
    let con = raw(&url).await;
    assert_eq!(
        clients_of_type(&con, "pubsub").await,
        1,
        "one pub/sub connection"
    );
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("distlock:*")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    assert_eq!(
        channels,
        vec!["distlock:evict".to_owned()],
        "one subscription"
    );

    let admin = RedisBackend::connect(&url).await.unwrap();
    let victim = LEASES / 2;
    admin
        .evict(&names[victim], None)
        .await
        .unwrap()
        .expect("held");
    let bound = declared_notice(&holder) + round_trip(&holder).await;
    tokio::time::timeout(bound, leases[victim].loss_signal().unwrap().cancelled())
        .await
        .expect("the evicted lease hears it");
    // Everything the eviction could fire has fired by now: it was one
    // message, handled before the signal above.
    let fired: Vec<usize> = (0..LEASES)
        .filter(|&i| leases[i].loss_signal().unwrap().is_cancelled())
        .collect();
    assert_eq!(fired, vec![victim], "only the evicted lease is lost");
}

/// The subscription connection drops and cannot come back for a while
/// (the server refuses connections through the proxy); an eviction
/// meanwhile is published to nobody. Once the holder's instance is
/// subscribed again it checks every lease it holds, and the evicted one
/// fires `lost()` then, long before its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_missed_while_unsubscribed_is_found_on_resubscribing() {
    let store = private(Options::durable()).await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let response = scaled(Duration::from_millis(300));
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(response)
        .connect_timeout(response);
    let holder = RedisBackend::connect_with(via).await.unwrap();
    let notice = declared_notice(&holder);
    let holder = Locker::new(holder).ttl(LONG);
    let admin = Locker::new(RedisBackend::connect(&store.url()).await.unwrap());
    let (evicted, kept) = (unique("missed"), unique("kept"));
    let evicted_guard = holder.acquire(&evicted).await.unwrap();
    let kept_guard = holder.acquire(&kept).await.unwrap();
    let con = raw(&store.url()).await;
    assert_eq!(clients_of_type(&con, "pubsub").await, 1);

    proxy.set(Mode::Refuse);
    proxy.reset_existing();
    until(
        scaled(Duration::from_secs(10)),
        "the subscription gone",
        || async { clients_of_type(&con, "pubsub").await == 0 },
    )
    .await;
    admin
        .force_release(&evicted, "test: evict while unsubscribed")
        .await
        .unwrap();
    assert!(evicted_guard.is_held(), "nobody could tell the holder yet");

    let healed = Instant::now();
    proxy.set(Mode::Pass);
    // Reconnect pause (at most 1 s), connect and subscribe, one check
    // round trip; then the message that fired it, at most the notice.
    let bound = resubscribed_within(response) + notice;
    let reason = tokio::time::timeout(bound, evicted_guard.lost())
        .await
        .unwrap_or_else(|_| panic!("lost() did not fire within {bound:?} of the link healing"));
    assert_eq!(reason, LossReason::StoreReported);
    println!("missed eviction found {:?} after healing", healed.elapsed());
    until(
        scaled(Duration::from_secs(10)),
        "the resubscription",
        || async { clients_of_type(&con, "pubsub").await == 1 },
    )
    .await;
    assert!(
        kept_guard.is_held(),
        "the check fires only the lease that is gone"
    );
    kept_guard.release().await.unwrap();
}

/// The longest a healed link takes to be subscribed again and checked:
/// the reconnect pause (at most 1 s), connect and subscribe, one check
/// round trip (each within the response timeout here), plus 1 s for
/// scheduling, scaled.
fn resubscribed_within(response: Duration) -> Duration {
    Duration::from_secs(1) + response * 3 + scaled(Duration::from_secs(1))
}

/// The subscription goes silent without closing (a partition that
/// swallows every byte, no RST): the eviction message is lost on the way.
/// The instance's `PING` goes unanswered within the response timeout, so
/// it drops that connection and subscribes again, and the check on
/// resubscribing finds the eviction. Without the `PING` the lease would be
/// deaf until its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_subscription_is_replaced_and_the_eviction_found() {
    let store = private(Options::durable()).await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let response = scaled(Duration::from_millis(300));
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(response)
        .connect_timeout(response);
    let holder = RedisBackend::connect_with(via).await.unwrap();
    let notice = declared_notice(&holder);
    let holder = Locker::new(holder).ttl(LONG);
    let admin = Locker::new(RedisBackend::connect(&store.url()).await.unwrap());
    let name = unique("silent");
    let guard = holder.acquire(&name).await.unwrap();
    let accepted = proxy.accepted();

    proxy.set(Mode::Blackhole);
    admin
        .force_release(&name, "test: evict behind a partition")
        .await
        .unwrap();
    // The instance gave up on its silent subscription: it connects again.
    until(
        resubscribed_within(response),
        "a new subscription attempt",
        || async { proxy.accepted() > accepted },
    )
    .await;
    assert!(guard.is_held(), "the message was swallowed");

    proxy.set(Mode::Pass);
    let bound = resubscribed_within(response) + notice;
    let reason = tokio::time::timeout(bound, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("lost() did not fire within {bound:?} of the link healing"));
    assert_eq!(reason, LossReason::StoreReported);
}

/// A server restart without persistence forgets every lock. The holder's
/// subscription drops with the server; on resubscribing the instance finds
/// its lock gone and fires `lost()`, without waiting for its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_lock_is_found_when_the_server_comes_back() {
    let store = private(Options::default().persistence(Persistence::None)).await;
    let response = scaled(Duration::from_millis(300));
    let config = RedisConfig::from_url(&store.url())
        .unwrap()
        .response_timeout(response)
        .connect_timeout(response);
    let holder = Locker::new(RedisBackend::connect_with(config).await.unwrap()).ttl(LONG);
    let guard = holder.acquire(&unique("forgotten")).await.unwrap();
    store.kill().await.unwrap();
    store.restart().await.unwrap();
    let back = Instant::now();
    let reason = tokio::time::timeout(resubscribed_within(response), guard.lost())
        .await
        .expect("lost() fires once the instance is subscribed again");
    assert_eq!(reason, LossReason::StoreReported);
    println!(
        "forgotten lock found {:?} after the restart",
        back.elapsed()
    );
}
