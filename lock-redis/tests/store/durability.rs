//! Fence durability per persistence setting, against private
//! `redis-server`s: what a kill -9 keeps, what a server without persistence
//! forgets, and why fences still grow. What a server evicts when memory
//! runs short is in `maxmemory`.

mod maxmemory;

use crate::support::*;
use lock_conformance::StoreControl;
use lock_conformance::kit::stores::redis::{self as launcher, Options, Persistence as Stored};
use lock_redis::redis::AsyncCommands;
use lock_redis::{Persistence, RedisBackend, RedisConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError, ReleaseOutcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aof_always_keeps_locks_and_fences_across_kill_9() {
    let store = private(Options::durable()).await;
    let backend = RedisBackend::connect(&store.url()).await.unwrap();
    assert_eq!(backend.persistence(), &Persistence::AofAlways);
    let (cycled, held_name) = (unique("cycled"), unique("held"));
    let mut last = None;
    for _ in 0..20 {
        let lease = take(&backend, &cycled, LONG).await;
        assert!(last < Some(lease.fence()));
        last = Some(lease.fence());
        backend.release(&lease).await.unwrap();
    }
    let held = take(&backend, &held_name, LONG).await;

    store.kill().await.unwrap();
    store.restart().await.unwrap();

    let after = RedisBackend::connect(&store.url()).await.unwrap();
    let holder = after.inspect(&held_name).await.unwrap();
    assert_eq!(
        holder.map(|h| h.fence),
        Some(held.fence()),
        "with appendfsync always a held lock survives the crash"
    );
    let first = take(&after, &cycled, LONG).await;
    assert!(
        Some(first.fence()) > last,
        "F2 across kill -9 with AOF always"
    );
    // The lease from before the crash still renews and releases.
    let renewed = after.renew(&held).await.unwrap();
    assert_eq!(
        after.release(&renewed).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// T3.6b, the documented limit: without persistence a restart forgets every
/// lock (a second holder can be granted while the first still believes it
/// holds, until its next renewal fails) and every counter. Fences still grow,
/// because a lost counter restarts at the server clock in microseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_persistence_forgets_locks_but_fences_still_grow() {
    let store = private(Options::default().persistence(Stored::None)).await;
    let url = store.url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(backend.persistence(), &Persistence::None);
    let refused = RedisBackend::connect_with(
        RedisConfig::from_url(&url)
            .unwrap()
            .require_durable_fences(true),
    )
    .await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig { .. })),
        "{refused:?}"
    );

    let lock = unique("forgotten");
    let held = take(&backend, &lock, LONG).await;
    store.kill().await.unwrap();
    store.restart().await.unwrap();

    let after = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(
        after.inspect(&lock).await.unwrap(),
        None,
        "the held lock is forgotten"
    );
    let fence_key = format!("distlock:{{{}}}:fence", lock.as_str());
    let counter: Option<String> = raw(&url).await.get(&fence_key).await.unwrap();
    assert_eq!(counter, None, "the fence counter is gone too");
    let second = take(&after, &lock, LONG).await;
    assert!(
        second.fence() > held.fence(),
        "the clock floor keeps fences growing: {} after {}",
        second.fence(),
        held.fence()
    );
    // The forgotten holder learns at its next renewal.
    assert!(matches!(
        after.renew(&held).await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(after.release(&held).await.unwrap(), ReleaseOutcome::NotHeld);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_is_read_at_connect() {
    let store = private(Options::default().persistence(Stored::AofEverysec)).await;
    let backend = RedisBackend::connect(&store.url()).await.unwrap();
    assert_eq!(backend.persistence(), &Persistence::AofEverysec);
    assert!(!backend.persistence().is_durable());
}

/// What an `everysec` power loss or an old snapshot does to the counter: it
/// goes back. The next fence is still above every fence issued before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_counter_still_grows() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let lock = unique("rolled-back");
    let first = take(&backend, &lock, LONG).await;
    backend.release(&first).await.unwrap();
    let fence_key = format!("distlock:{{{}}}:fence", lock.as_str());
    let () = raw(&url).await.set(&fence_key, "5").await.unwrap();
    let second = take(&backend, &lock, LONG).await;
    assert!(
        second.fence() > first.fence(),
        "{} after {}",
        second.fence(),
        first.fence()
    );
    backend.release(&second).await.unwrap();
}
