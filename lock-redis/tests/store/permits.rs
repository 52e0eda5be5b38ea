//! Semaphores on Redis: their keys, apart from the lock of the same name;
//! labels and slots on the server; one script per operation; renewals of
//! locks and permits batched into one script, each checked on its own.

use std::time::Duration;

use crate::support::{LONG, command_calls, private, raw, take, unique};
use lock_conformance::kit::stores::redis as launcher;
use lock_conformance::kit::until;
use lock_redis::RedisBackend;
use lock_redis::redis::AsyncCommands;
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::{Attempt, HolderLabel, Lease, LockBackend, LockError, LockName};

fn request(backend: &RedisBackend, name: &LockName, label: &str, ttl: Duration) -> LockRequest {
    LockRequest::new(
        name.clone(),
        backend.capabilities().effective_ttl(ttl).unwrap(),
    )
    .with_label(HolderLabel::new(label).unwrap())
}

async fn permit(backend: &RedisBackend, request: &LockRequest, permits: u32) -> Lease {
    match backend.try_acquire_permit(request, permits).await.unwrap() {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{} should have a free permit", request.name()),
    }
}

/// Two permits of three: two slots in the slot set with server-time expiries,
/// the holders' `owner:fence label` and the count in the holders hash, a
/// fence counter of its own; the lock of the same name is another thing.
/// Releasing both leaves only the fence counter and the count (which lapses
/// with the last permit's TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_live_in_keys_of_their_own() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = raw(&url).await;
    let name = unique("sem-keys");
    let base = format!("distlock:{{{}}}:permits", name.as_str());
    let first = permit(&backend, &request(&backend, &name, "worker 1", LONG), 3).await;
    let second = permit(&backend, &request(&backend, &name, "worker 2", LONG), 3).await;
    assert_eq!((first.slot(), second.slot()), (Some(0), Some(1)));
    assert!(second.fence() > first.fence());
    let slots: Vec<(String, u64)> = con.zrange_withscores(&base, 0, -1).await.unwrap();
    assert_eq!(
        slots.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
        ["0", "1"]
    );
    let holders: std::collections::HashMap<String, String> =
        con.hgetall(format!("{base}:holders")).await.unwrap();
    assert_eq!(holders["permits"], "3");
    assert_eq!(
        holders["1"],
        format!("{}:{} worker 2", second.owner().encode(), second.fence())
    );
    let fence: u64 = con.get(format!("{base}:fence")).await.unwrap();
    assert_eq!(fence, second.fence().get());

    let lock = take(&backend, &name, LONG).await;
    assert!(backend.inspect_permits(&name).await.unwrap().len() == 2);
    backend.release(&lock).await.unwrap();

    backend.release(&first).await.unwrap();
    backend.release(&second).await.unwrap();
    let left: bool = con.exists(&base).await.unwrap();
    assert!(!left, "no slot left taken");
    assert!(backend.inspect_permits(&name).await.unwrap().is_empty());
}

/// Zero permits is bad input, refused before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_permits_is_a_config_error() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let name = unique("sem-zero");
    let refused = backend
        .try_acquire_permit(&request(&backend, &name, "x", LONG), 0)
        .await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig { .. })),
        "{refused:?}"
    );
}

/// `renew_many` over two locks, two permits, a released lock and a permit
/// whose slot was taken again: one script in all, one result per lease in
/// order, each checked on its own (the stale two are `NotHeld`, and the
/// slot's new holder keeps it). The server runs every batch of up to 1,000
/// leases as one script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_batches_locks_and_permits_and_checks_each() {
    // A server of its own: the script count is the server's.
    let store = private(launcher::Options::default()).await;
    let url = store.url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let con = raw(&url).await;
    let short = Duration::from_millis(300);
    let (a, b, gone) = (unique("batch-a"), unique("batch-b"), unique("batch-gone"));
    let sem = unique("batch-sem");
    let locks = [
        take(&backend, &a, LONG).await,
        take(&backend, &b, LONG).await,
    ];
    let released = take(&backend, &gone, LONG).await;
    backend.release(&released).await.unwrap();
    let held = permit(&backend, &request(&backend, &sem, "p", LONG), 2).await;
    let stale = permit(&backend, &request(&backend, &sem, "p", short), 2).await;
    // The short permit expires; its slot goes to someone else.
    until(
        Duration::from_secs(10),
        "the short permit expires",
        || async { backend.inspect_permits(&sem).await.unwrap().len() == 1 },
    )
    .await;
    let successor = permit(&backend, &request(&backend, &sem, "p", LONG), 2).await;
    assert_eq!(successor.slot(), stale.slot());

    let batch = [
        locks[0].clone(),
        held.clone(),
        released.clone(),
        stale.clone(),
        locks[1].clone(),
    ];
    // The server learns the script at its first use (NOSCRIPT, then load).
    backend.renew(&locks[0]).await.unwrap();
    let before = command_calls(&con, "evalsha").await;
    let renewed = backend.renew_many(&batch).await;
    assert_eq!(
        command_calls(&con, "evalsha").await - before,
        1,
        "one script"
    );
    let outcome: Vec<bool> = renewed.iter().map(Result::is_ok).collect();
    assert_eq!(outcome, [true, true, false, false, true]);
    for (lease, result) in batch.iter().zip(&renewed) {
        match result {
            Ok(renewed) => assert_eq!(
                (renewed.fence(), renewed.slot()),
                (lease.fence(), lease.slot())
            ),
            Err(e) => assert!(matches!(e, LockError::NotHeld { .. }), "{e:?}"),
        }
    }
    let holders = backend.inspect_permits(&sem).await.unwrap();
    assert!(
        holders
            .iter()
            .any(|h| h.slot == successor.slot() && h.fence == successor.fence()),
        "the slot's new holder keeps it: {holders:?}"
    );
    for lease in locks.iter().chain([&held, &successor]) {
        backend.release(lease).await.unwrap();
    }
}
