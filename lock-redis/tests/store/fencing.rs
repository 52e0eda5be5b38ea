//! Resource-side fencing (`fenced_write`) and the fence floor.

use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{RedisBackend, fenced_write};
use lockcore::backend::LockBackendExt;
use lockcore::{Fenced, StaleToken};
use lockcore::{FencingToken, LockBackend, LockError};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_refuse_older_tokens() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = backend.client();
    let tag = format!("{{order:{:x}}}", rand_u64());
    let (fence_key, data_key) = (format!("{tag}:fence"), format!("{tag}:data"));
    let token = |n: u64| FencingToken::new(n).unwrap();
    let set = |v: &str| redis::cmd("SET").arg(&data_key).arg(v).clone();

    let applied: Fenced<String> = fenced_write(&mut con, &fence_key, token(5), &set("five"))
        .await
        .unwrap();
    assert_eq!(applied, Ok("OK".into()));
    let again: Fenced<String> = backend
        .fenced_write(&fence_key, token(5), &set("five again"))
        .await
        .unwrap();
    assert!(again.is_ok(), "equal tokens pass");
    let stale: Fenced<String> = fenced_write(&mut con, &fence_key, token(4), &set("four"))
        .await
        .unwrap();
    assert_eq!(
        stale,
        Err(StaleToken {
            token: token(4),
            highest: token(5)
        })
    );
    let data: String = con.get(&data_key).await.unwrap();
    assert_eq!(data, "five again");

    // Exact for every u64, beyond Lua's 2^53.
    let big = u64::MAX - 1;
    let applied: Fenced<String> = fenced_write(&mut con, &fence_key, token(big), &set("big"))
        .await
        .unwrap();
    assert!(applied.is_ok());
    let stale: Fenced<String> = fenced_write(&mut con, &fence_key, token(big - 1), &set("no"))
        .await
        .unwrap();
    assert_eq!(stale.unwrap_err().highest, token(big));

    // A failing command changes nothing, the fence included.
    let incr = redis::cmd("INCR").arg(&data_key).clone();
    let failed = fenced_write::<i64, _>(&mut con, &fence_key, token(u64::MAX), &incr).await;
    assert!(matches!(failed, Err(LockError::Store { .. })), "{failed:?}");
    let last: String = con.get(&fence_key).await.unwrap();
    assert_eq!(last, big.to_string());

    let empty =
        fenced_write::<(), _>(&mut con, &fence_key, token(u64::MAX), &redis::Cmd::new()).await;
    assert!(
        matches!(empty, Err(LockError::InvalidConfig { .. })),
        "{empty:?}"
    );
    let () = con.set(&fence_key, "garbage").await.unwrap();
    let garbage = fenced_write::<String, _>(&mut con, &fence_key, token(9), &set("x")).await;
    assert!(
        matches!(garbage, Err(LockError::Store { .. })),
        "{garbage:?}"
    );
    let _: () = con.del(&[&fence_key, &data_key]).await.unwrap();
}

/// A backend on `url` with a key prefix of its own, so that raising its
/// fence floor touches no other test's keys.
async fn own_prefix(url: &str) -> RedisBackend {
    let config = lock_redis::RedisConfig::from_url(url)
        .unwrap()
        .key_prefix(format!("floor{:x}:", rand_u64()));
    RedisBackend::connect_with(config).await.unwrap()
}

/// `raise_fence_floor` writes one floor key per Cluster slot (so each
/// name's scripts read it in their own slot), lifts locks and permits of
/// names in any slot above it, and never lowers a floor; a floor Lua could
/// not count exactly is refused before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_is_per_slot_lifts_every_grant_and_never_lowers() {
    let url = launcher::shared().url();
    let backend = own_prefix(&url).await;
    let mut con = raw(&url).await;
    let floor = server_micros(&mut con).await + 3_600_000_000;
    let floor = FencingToken::new(floor).unwrap();
    backend.raise_fence_floor(floor).await.unwrap();
    let floors: Vec<String> = con
        .keys(format!("{}fence-floor:*", backend.key_prefix()))
        .await
        .unwrap();
    assert_eq!(floors.len(), 16384, "one floor key per Cluster slot");
    let mut fences = Vec::new();
    for i in 0..20 {
        let lock = take(&backend, &unique(&format!("floor-{i}")), LONG).await;
        backend.release(&lock).await.unwrap();
        fences.push(lock.fence());
    }
    let request = lockcore::backend::LockRequest::new(
        unique("floor-permits"),
        backend.capabilities().effective_ttl(LONG).unwrap(),
    );
    let permit = backend
        .try_acquire_permit(&request, 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    backend.release(&permit).await.unwrap();
    fences.push(permit.fence());
    assert!(
        fences.iter().all(|f| *f > floor),
        "{fences:?} after floor {floor}"
    );

    // A lower floor (the runbook run twice, or an older number) moves nothing back.
    backend
        .raise_fence_floor(FencingToken::new(1).unwrap())
        .await
        .unwrap();
    let kept: String = con.get(&floors[0]).await.unwrap();
    assert_eq!(kept, floor.to_string());

    let beyond = FencingToken::new(1 << 53).unwrap();
    assert!(matches!(
        backend.raise_fence_floor(beyond).await,
        Err(LockError::InvalidConfig { .. })
    ));
}

/// Redis scripts count in doubles, exactly only below 2^53: the backend
/// declares that as its largest fence, and a floor that leaves no room to
/// count below it (within `Capabilities::FENCE_FLOOR_HEADROOM` of it, up to
/// i64::MAX) is refused with `InvalidConfig` before any I/O (the link is
/// blackholed: any request would time out), changing nothing. The largest
/// floor accepted still lets locks and permits be granted, exactly above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_fence_is_declared_and_floors_beyond_it_are_refused_before_any_io() {
    let store = private(Options::durable()).await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let response = Duration::from_secs(2);
    let config = lock_redis::RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(response);
    let backend = RedisBackend::connect_with(config).await.unwrap();
    let caps = backend.capabilities();
    assert_eq!(
        caps.max_fence,
        (1 << 53) - 1,
        "Lua counts exactly below 2^53"
    );
    let largest = caps.max_fence_floor();

    proxy.set(Mode::Blackhole);
    for floor in [largest + 1, 1 << 53, i64::MAX as u64 - 1, i64::MAX as u64] {
        let started = Instant::now();
        let refused = backend
            .raise_fence_floor(FencingToken::new(floor).unwrap())
            .await;
        assert!(
            matches!(refused, Err(LockError::InvalidConfig { .. })),
            "floor {floor}: {refused:?}"
        );
        assert!(
            started.elapsed() < response,
            "floor {floor} was refused only after a request"
        );
    }
    proxy.set(Mode::Pass);
    let mut con = raw(&store.url()).await;
    let floors: Vec<String> = con.keys("distlock:fence-floor:*").await.unwrap();
    assert_eq!(
        floors,
        Vec::<String>::new(),
        "a refused floor changed nothing"
    );

    backend
        .raise_fence_floor(FencingToken::new(largest).unwrap())
        .await
        .unwrap();
    let lock = unique("largest-floor");
    for n in 1..=3 {
        let lease = take(&backend, &lock, LONG).await;
        assert_eq!(lease.fence().get(), largest + n, "grant {n}");
        backend.release(&lease).await.unwrap();
    }
    let request = lockcore::backend::LockRequest::new(
        unique("largest-floor-permits"),
        caps.effective_ttl(LONG).unwrap(),
    );
    let permit = backend
        .try_acquire_permit(&request, 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert_eq!(permit.fence().get(), largest + 1);
    backend.release(&permit).await.unwrap();
}

/// The restore procedure (docs/operations.md §5) on Redis. Fences here run
/// ahead of the server clock (a floor raised an hour ahead, as after an
/// earlier restore or a clock that stepped back), so the clock floor of
/// every fence cannot hide a rollback. Restoring an older AOF copy moves the
/// fence counter back: without the procedure the next fence repeats one
/// already handed out; raising the floor to the highest fence in use
/// before reopening makes the next fence larger than every one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_repeats_fences_unless_the_floor_is_raised() {
    let store = private(lock_conformance::kit::stores::redis::Options::durable()).await;
    let url = store.url();
    let aof = store.data_dir().unwrap().join("appendonlydir");
    let backup = store.data_dir().unwrap().join("backup");
    let mut con = raw(&url).await;
    let ahead = server_micros(&mut con).await + 3_600_000_000;
    let backend = connect_scaled(&url).await;
    backend
        .raise_fence_floor(FencingToken::new(ahead).unwrap())
        .await
        .unwrap();
    let lock = unique("restored");
    let cycle = async |backend: &RedisBackend| {
        let lease = take(backend, &lock, LONG).await;
        backend.release(&lease).await.unwrap();
        lease.fence()
    };
    let in_backup = cycle(&backend).await;
    copy_dir(&aof, &backup);
    let mut newest = in_backup;
    for _ in 0..3 {
        newest = cycle(&backend).await;
    }
    drop(backend);

    let restore = |store: &lock_conformance::kit::stores::Store| {
        store.kill_now().unwrap();
        copy_dir(&backup, &aof);
        store.restart_now().unwrap();
    };
    restore(&store);
    let careless = RedisBackend::connect(&url).await.unwrap();
    let repeated = cycle(&careless).await;
    assert!(
        repeated <= newest,
        "without the procedure the counter restarts from the backup: {repeated} after {newest}"
    );
    drop(careless);

    restore(&store);
    let operator = RedisBackend::connect(&url).await.unwrap();
    operator.raise_fence_floor(newest).await.unwrap();
    let next = cycle(&operator).await;
    assert!(
        next > newest,
        "after raising the floor to {newest} the next fence is {next}"
    );
}
