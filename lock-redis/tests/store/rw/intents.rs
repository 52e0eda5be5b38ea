//! A waiting writer's intent: readers kept out while it waits (however
//! long, past its TTL), gone with its grant or when it stops waiting,
//! lapsing on the server's clock within its TTL when it is cut off.

use std::time::Duration;

use super::{intents, refused, share, writer_waits};
use crate::support::{LONG, cut_and_direct, patient, raw, round_trip, unique};
use lock_conformance::kit::proxy::Mode;
use lock_conformance::kit::stores::redis as launcher;
use lock_conformance::kit::until;
use lock_redis::RedisBackend;
use lockcore::backend::Kind;
use lockcore::{Access, LockBackend};
use tokio::time::Instant;

/// A writer waiting behind a reader leaves its intent in the store: new
/// readers are refused while it is there (`try_write` leaves none). The
/// reader's release hands the name to the writer, whose grant removes the
/// intent in the same script, with a fence above the reader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_goes_before_new_readers() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let con = raw(&url).await;
    let name = unique("rw-intent");
    let reader = share(&backend, &name, Access::Read, LONG).await;
    assert!(refused(&backend, &name, Access::Write).await);
    assert!(
        intents(&con, &name).await.is_empty(),
        "try_write waits for nothing"
    );
    assert!(!refused(&backend, &name, Access::Read).await);

    let writer = writer_waits(&backend, &name, LONG, Duration::from_secs(30));
    until(Duration::from_secs(10), "the writer's intent", || async {
        intents(&con, &name).await.len() == 1
    })
    .await;
    assert!(refused(&backend, &name, Access::Read).await);
    backend.release(&reader).await.unwrap();
    let lease = writer
        .await
        .unwrap()
        .unwrap()
        .expect("the writer is granted");
    assert_eq!(lease.access(), Some(Access::Write));
    assert!(lease.fence() > reader.fence());
    assert!(intents(&con, &name).await.is_empty(), "gone with its grant");
    assert!(refused(&backend, &name, Access::Read).await);
    assert!(refused(&backend, &name, Access::Write).await);
    let listed = backend.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].access, Some(Access::Write));
    assert_eq!(listed[0].fence, lease.fence());
    backend.release(&lease).await.unwrap();
}

/// A writer that stops waiting, by timing out or by its future being
/// dropped, takes its intent away at once, and the reader it kept waiting
/// (woken only by the store: a minute's re-check) is granted then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stops_waiting_takes_its_intent_away() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let con = raw(&url).await;
    let allowance = round_trip(&backend).await;
    let name = unique("rw-gives-up");
    let holder = share(&backend, &name, Access::Read, LONG).await;

    // Timed out.
    let timeout = Duration::from_millis(800);
    let writer = writer_waits(&backend, &name, LONG, timeout);
    until(Duration::from_secs(10), "the writer's intent", || async {
        intents(&con, &name).await.len() == 1
    })
    .await;
    let readers = patient(backend.clone()).rw_lock(name.clone()).unwrap();
    let reader = tokio::spawn(async move {
        let guard = readers.read().await;
        (guard, Instant::now())
    });
    assert!(writer.await.unwrap().unwrap().is_none(), "timed out");
    let gave_up = Instant::now();
    let (guard, granted) = reader.await.unwrap();
    let guard = guard.expect("the reader is granted once the writer gave up");
    assert!(
        granted.saturating_duration_since(gave_up) < allowance * 2,
        "woken by the store, not by a re-check"
    );
    assert!(intents(&con, &name).await.is_empty());
    guard.release().await.unwrap();

    // Dropped.
    let writer = writer_waits(&backend, &name, LONG, LONG);
    until(Duration::from_secs(10), "the writer's intent", || async {
        intents(&con, &name).await.len() == 1
    })
    .await;
    assert!(refused(&backend, &name, Access::Read).await);
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    until(
        allowance * 4,
        "the dropped writer's intent gone",
        || async { intents(&con, &name).await.is_empty() },
    )
    .await;
    assert!(!refused(&backend, &name, Access::Read).await);
    backend.release(&holder).await.unwrap();
}

/// A writer with a short TTL waits for several TTLs: each attempt renews
/// its intent (its expiry one TTL ahead on the server's clock), and the
/// loop comes back within a third of the TTL, so the intent never lapses
/// and no reader gets in meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_intent_is_kept_past_its_ttl() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let con = raw(&url).await;
    let name = unique("rw-refresh");
    let holder = share(&backend, &name, Access::Read, LONG).await;
    let ttl = Duration::from_millis(600);
    let writer = writer_waits(&backend, &name, ttl, LONG);
    until(Duration::from_secs(10), "the writer's intent", || async {
        intents(&con, &name).await.len() == 1
    })
    .await;
    let watched = Instant::now();
    while watched.elapsed() < ttl * 4 {
        assert_eq!(intents(&con, &name).await.len(), 1, "kept while waiting");
        assert!(refused(&backend, &name, Access::Read).await);
        tokio::time::sleep(ttl / 10).await;
    }
    backend.release(&holder).await.unwrap();
    let lease = writer.await.unwrap().unwrap().expect("granted");
    assert!(intents(&con, &name).await.is_empty());
    backend.release(&lease).await.unwrap();
}

/// A waiting writer cut off from the server (its process as good as dead:
/// nothing it sends arrives) cannot refresh nor remove its intent: the
/// intent lapses on the server's clock within the writer's TTL, and
/// readers are granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_writers_intent_lapses_within_its_ttl() {
    let store = launcher::shared();
    let (proxy, cut, direct) = cut_and_direct(&store).await;
    let con = raw(&store.url()).await;
    let allowance = round_trip(&direct).await;
    let name = unique("rw-dead-writer");
    let holder = share(&direct, &name, Access::Read, LONG).await;
    let ttl = Duration::from_secs(2);
    let writer = writer_waits(&cut, &name, ttl, LONG);
    until(Duration::from_secs(10), "the writer's intent", || async {
        intents(&con, &name).await.len() == 1
    })
    .await;
    proxy.set(Mode::Blackhole);
    let cut_off = Instant::now();
    assert!(refused(&direct, &name, Access::Read).await);
    until(ttl + allowance * 2, "the intent lapses", || async {
        !refused(&direct, &name, Access::Read).await
    })
    .await;
    let lapsed = cut_off.elapsed();
    assert!(
        lapsed <= ttl + allowance * 2,
        "readers admitted {lapsed:?} after the writer was cut off"
    );
    writer.abort();
    direct.release(&holder).await.unwrap();
}
