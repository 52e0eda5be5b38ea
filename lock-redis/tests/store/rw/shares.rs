//! Shares: their keys, one fence counter above the floor, a lost grant
//! reply given back, the batch renewal, close, and a Redis Cluster.

use std::collections::HashMap;
use std::time::Duration;

use super::{base, request, share};
use crate::support::{LONG, cut_and_direct, private, raw, server_micros, take, unique};
use lock_conformance::kit::proxy::Mode;
use lock_conformance::kit::stores::redis as launcher;
use lock_conformance::kit::until;
use lock_redis::RedisBackend;
use lock_redis::redis::AsyncCommands;
use lockcore::backend::{Kind, LockBackendExt, LockRequest};
use lockcore::{Access, FencingToken, HolderLabel, LockBackend, LockError, Locker, ReleaseOutcome};
use tokio::time::Instant;

/// Two readers: their holders `read:<owner>` in the shares with server-time
/// expiries, `owner:fence label` in the holders hash, a fence counter of
/// the reader-writer lock's own; the lock and the semaphore of the same
/// name are other things. Releasing both leaves only the fence counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_live_in_keys_of_their_own() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = raw(&url).await;
    let name = unique("rw-keys");
    let base = base(&name);
    let first = share(&backend, &name, Access::Read, LONG).await;
    let second = share(&backend, &name, Access::Read, LONG).await;
    assert!(second.fence() > first.fence());
    assert_eq!(first.access(), Some(Access::Read));
    let now_ms = server_micros(&mut con).await / 1000;
    let shares: Vec<(String, u64)> = con.zrange_withscores(&base, 0, -1).await.unwrap();
    let mut ids: Vec<&str> = shares.iter().map(|(s, _)| s.as_str()).collect();
    ids.sort_unstable();
    let mut expected = [
        format!("read:{}", first.owner().encode()),
        format!("read:{}", second.owner().encode()),
    ];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    for (_, expiry) in &shares {
        let left = expiry.saturating_sub(now_ms);
        assert!(left > LONG.as_millis() as u64 - 5_000 && left <= LONG.as_millis() as u64);
    }
    let holders: HashMap<String, String> = con.hgetall(format!("{base}:holders")).await.unwrap();
    assert_eq!(
        holders[&format!("read:{}", second.owner().encode())],
        format!("{}:{} reader", second.owner().encode(), second.fence())
    );
    let fence: u64 = con.get(format!("{base}:fence")).await.unwrap();
    assert_eq!(fence, second.fence().get());

    // The lock and a semaphore of the same name are free, and apart.
    let lock = take(&backend, &name, LONG).await;
    assert!(lock.fence() != second.fence());
    let listed = backend.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(listed.len(), 2);
    for holder in &listed {
        assert_eq!(holder.access, Some(Access::Read));
        assert_eq!(holder.label, Some(HolderLabel::new("reader").unwrap()));
        assert!(holder.expires_in.is_some_and(|left| left <= LONG));
    }
    assert_eq!(
        backend.holders(&name, Kind::Lock).await.unwrap()[0].access,
        None
    );
    backend.release(&lock).await.unwrap();

    assert_eq!(
        backend.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        backend.release(&second).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        backend.release(&second).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    for gone in [base.clone(), format!("{base}:holders")] {
        let left: bool = con.exists(&gone).await.unwrap();
        assert!(!left, "{gone} is gone with the last share");
    }
    assert!(
        backend
            .holders(&name, Kind::ReadWrite)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Reads and writes take their fences from one counter, above every fence
/// before and above a fence floor raised after a restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_draw_one_counter_above_the_floor() {
    let store = private(launcher::Options::default()).await;
    let url = store.url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = raw(&url).await;
    let name = unique("rw-floor");
    let read = share(&backend, &name, Access::Read, LONG).await;
    backend.release(&read).await.unwrap();
    let write = share(&backend, &name, Access::Write, LONG).await;
    assert!(write.fence() > read.fence());
    backend.release(&write).await.unwrap();
    // An hour ahead of the server clock, in microseconds like fences.
    let floor = server_micros(&mut con).await + 3_600_000_000;
    backend
        .raise_fence_floor(FencingToken::new(floor).unwrap())
        .await
        .unwrap();
    let read = share(&backend, &name, Access::Read, LONG).await;
    assert!(read.fence().get() > floor, "above the floor");
    let second = share(&backend, &name, Access::Read, LONG).await;
    assert!(second.fence() > read.fence());
    backend.release(&read).await.unwrap();
    backend.release(&second).await.unwrap();
    let write = share(&backend, &name, Access::Write, LONG).await;
    assert!(write.fence() > second.fence());
    backend.release(&write).await.unwrap();
}

/// The reply to a write's grant is lost: the caller gets a retryable
/// error, and the share the store did grant is given back as soon as the
/// network heals, long before its TTL; the name is free for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_share_reply_leaves_no_phantom_holder() {
    let store = launcher::shared();
    let (proxy, cut, direct) = cut_and_direct(&store).await;
    let name = unique("rw-phantom");
    let write = request(&cut, &name, Access::Write, LONG);
    // Load the script first, so the lost request really runs on the server.
    let warm = cut.try_acquire(&write).await.unwrap().into_lease().unwrap();
    cut.release(&warm).await.unwrap();

    proxy.set(Mode::DropDownstream);
    let outcome = cut.try_acquire(&write).await;
    assert!(
        matches!(&outcome, Err(e) if e.is_retryable()),
        "a lost reply is a retryable error: {outcome:?}"
    );
    let phantom = direct.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(phantom.len(), 1, "the lost acquire ran on the server");
    assert_eq!(phantom[0].access, Some(Access::Write));

    proxy.set(Mode::Pass);
    let healed = Instant::now();
    until(
        Duration::from_secs(10),
        "the phantom share given back",
        || async {
            direct
                .holders(&name, Kind::ReadWrite)
                .await
                .unwrap()
                .is_empty()
        },
    )
    .await;
    assert!(
        healed.elapsed() < LONG / 4,
        "given back long before the TTL"
    );
    let lease = share(&direct, &name, Access::Read, LONG).await;
    assert!(lease.fence() > phantom[0].fence);
    direct.release(&lease).await.unwrap();
}

/// `renew_many` over a lock, a permit, two read shares and a share that
/// expired: one script, one result per lease in order, each checked on its
/// own (the expired share is `NotHeld` and not re-created).
/// `set_remaining` sets a share's expiry on the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_renew_in_the_batch_with_locks_and_permits() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = raw(&url).await;
    let (lock_name, sem, name) = (unique("rw-b-lock"), unique("rw-b-sem"), unique("rw-b"));
    let short = Duration::from_millis(300);
    let lock = take(&backend, &lock_name, LONG).await;
    let permit = backend
        .try_acquire_permit(
            &LockRequest::new(
                sem.clone(),
                backend.capabilities().effective_ttl(LONG).unwrap(),
            ),
            2,
        )
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let a = share(&backend, &name, Access::Read, LONG).await;
    let stale = share(&backend, &name, Access::Read, short).await;
    until(
        Duration::from_secs(10),
        "the short share expires",
        || async { backend.holders(&name, Kind::ReadWrite).await.unwrap().len() == 1 },
    )
    .await;
    let b = share(&backend, &name, Access::Read, LONG).await;
    let renewed = backend
        .renew_many(&[
            lock.clone(),
            a.clone(),
            stale.clone(),
            permit.clone(),
            b.clone(),
        ])
        .await;
    assert!(renewed[0].is_ok() && renewed[1].is_ok() && renewed[3].is_ok() && renewed[4].is_ok());
    assert!(
        matches!(renewed[2], Err(LockError::NotHeld { .. })),
        "{:?}",
        renewed[2]
    );
    assert_eq!(
        backend.holders(&name, Kind::ReadWrite).await.unwrap().len(),
        2
    );

    let remaining = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(5))
        .unwrap();
    backend.set_remaining(&a, remaining).await.unwrap();
    let now_ms = server_micros(&mut con).await / 1000;
    let expiry: u64 = con
        .zscore(base(&name), format!("read:{}", a.owner().encode()))
        .await
        .unwrap();
    let left = expiry.saturating_sub(now_ms);
    assert!((4_000..=5_000).contains(&left), "{left} ms left");

    for lease in [&lock, &permit, &a, &b] {
        assert_eq!(
            backend.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    assert_eq!(
        backend.release(&stale).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
}

/// Closing the backend fires the loss of its shares at once, as of its
/// locks; a `Locker` over a closed backend gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_loses_shares() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone()).ttl(LONG);
    let name = unique("rw-close");
    let rw = locker.rw_lock(name.clone()).unwrap();
    let read = rw.try_read().await.unwrap().expect("granted");
    backend.close().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), read.lost())
        .await
        .expect("lost at close");
    assert!(rw.try_read().await.is_err());
}

/// On a Redis Cluster, every key of a reader-writer lock shares its name's
/// slot, so each script runs there: shares of names spread over every
/// primary are granted, renewed in one batch with locks (one script per
/// primary, each share judged on its own), kept out by a waiting writer's
/// intent, and released.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_work_on_a_cluster() {
    use super::{refused, writer_waits};
    use lock_conformance::kit::stores::redis_cluster;
    use lockcore::LockName;
    let cluster = tokio::task::spawn_blocking(redis_cluster::shared)
        .await
        .expect("launcher thread");
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    let base_name = unique("rw-cluster");
    let mut leases = Vec::new();
    for i in 0..24 {
        let name = LockName::new(format!("{base_name}/{i}")).unwrap();
        leases.push(share(&backend, &name, Access::Read, LONG).await);
        leases.push(share(&backend, &name, Access::Read, LONG).await);
        leases.push(take(&backend, &name, LONG).await);
    }
    let renewed = backend.renew_many(&leases).await;
    assert!(renewed.iter().all(Result::is_ok), "{renewed:?}");

    let name = leases[0].name().clone();
    let writer = writer_waits(&backend, &name, LONG, Duration::from_secs(30));
    until(Duration::from_secs(10), "the writer's intent", || async {
        refused(&backend, &name, Access::Read).await
    })
    .await;
    backend.release(&leases[0]).await.unwrap();
    backend.release(&leases[1]).await.unwrap();
    let write = writer
        .await
        .unwrap()
        .unwrap()
        .expect("the writer is granted");
    assert!(write.fence() > leases[1].fence());
    let listed = backend.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].access, Some(Access::Write));
    backend.release(&write).await.unwrap();
    for lease in &leases[2..] {
        assert_eq!(
            backend.release(lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}
