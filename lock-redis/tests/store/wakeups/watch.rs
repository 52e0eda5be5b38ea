//! `LockBackend::watch` on Redis: one message per backend instance at a
//! release or forced release, whatever the number of its watches; a wake-up
//! at the holder's expiry (which sends no message); nothing left behind.

use lockcore::backend::Kind;
use std::time::Duration;

use crate::support::{LONG, raw, round_trip, scaled, take, unique};
use lock_conformance::kit::stores::redis as launcher;
use lock_redis::RedisBackend;
use lock_redis::redis::AsyncCommands;
use lockcore::backend::wait::Wakeup;
use lockcore::{LockBackend, ReleaseOutcome};
use tokio::time::Instant;

/// The watcher set of `name` on the server.
fn watchers_key(name: &lockcore::LockName) -> String {
    format!("distlock:{{{}}}:watchers", name.as_str())
}

/// Whether `wakeup` completes within `within`.
async fn wakes(wakeup: &mut Wakeup, within: Duration) -> bool {
    tokio::time::timeout(within, wakeup).await.is_ok()
}

/// Fifty watches of one instance register it once in the store; one
/// release publishes one message, which wakes all fifty; the registration
/// is gone afterwards. A forced release wakes a watch too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_registration_per_instance_wakes_all_its_watches() {
    let url = launcher::shared().url();
    let (holder, watcher) = (
        RedisBackend::connect(&url).await.unwrap(),
        RedisBackend::connect(&url).await.unwrap(),
    );
    let mut con = raw(&url).await;
    let rtt = round_trip(&holder).await;
    let name = unique("watched");
    let lease = take(&holder, &name, LONG).await;
    let mut watches = Vec::new();
    for _ in 0..50 {
        watches.push(
            watcher
                .watch(&name, Kind::Lock)
                .await
                .unwrap()
                .expect("a store wake-up"),
        );
    }
    let registered: usize = con.scard(watchers_key(&name)).await.unwrap();
    assert_eq!(registered, 1, "one registration for the instance");
    assert!(
        !wakes(&mut watches[0], scaled(Duration::from_millis(200))).await,
        "no wake-up while the lock stays held"
    );
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let released = Instant::now();
    for watch in &mut watches {
        assert!(wakes(watch, rtt).await, "every watch wakes within {rtt:?}");
    }
    println!(
        "50 watches woken {:?} after the release",
        released.elapsed()
    );
    let left: bool = con.exists(watchers_key(&name)).await.unwrap();
    assert!(!left, "registrations are one-shot");

    let lease = take(&holder, &name, LONG).await;
    let mut watch = watcher.watch(&name, Kind::Lock).await.unwrap().unwrap();
    assert!(holder.evict(&name, None).await.unwrap().is_some());
    assert!(
        wakes(&mut watch, rtt).await,
        "a forced release wakes watches"
    );
    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
}

/// Expiry sends no message: a watch armed on a lock with a short TTL wakes
/// when the TTL runs out, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_wakes_when_the_holder_expires() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let rtt = round_trip(&backend).await;
    let name = unique("expiring");
    let ttl = scaled(Duration::from_millis(600));
    let lease = take(&backend, &name, ttl).await;
    let mut watch = backend.watch(&name, Kind::Lock).await.unwrap().unwrap();
    let armed = Instant::now();
    let early = (lease.issued().mono() + ttl).saturating_duration_since(armed);
    assert!(
        !wakes(&mut watch, early.saturating_sub(Duration::from_millis(50))).await,
        "woke before the holder's TTL ran out"
    );
    assert!(
        wakes(&mut watch, Duration::from_millis(50) + rtt).await,
        "no wake-up at the holder's expiry"
    );
}
