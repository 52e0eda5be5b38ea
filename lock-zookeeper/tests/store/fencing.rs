//! Fencing: `fenced_write` applies a write through a fence node only with a
//! token not older than the newest applied, in one transaction with the
//! write itself; and the fence floor's range: ZooKeeper fences are a `czxid`
//! plus the floor's offset, declared to count up to `i64::MAX`
//! (`Capabilities::max_fence`), so a floor past what that leaves room for is
//! refused before any I/O and changes nothing, and the largest floor
//! accepted still lets grants happen.

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{fenced_write, zk};
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::{Capabilities, FencingToken, LockBackend, LockError};
use tokio::time::{Instant, timeout};

use crate::support::{
    answered, behind_proxy, connect, connect_with, connections, raw, session_id, silent_drop, take,
    unique,
};

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

/// Newer and equal tokens write, an older one is refused without writing,
/// and a write that fails leaves the fence where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_tokens_are_refused_and_failed_writes_move_no_fence() {
    let store = zookeeper::shared();
    let client = raw(&store.endpoint()).await;
    let base = format!("/zk-fenced-{}", uuid::Uuid::new_v4().simple());
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create(&base, &[], &open).await.unwrap();
    let (fence, data) = (format!("{base}/fence"), format!("{base}/data"));
    client.create(&data, b"none", &open).await.unwrap();
    let set = |value: &'static [u8]| {
        let data = data.clone();
        move |multi: &mut zk::MultiWriter<'_>| multi.add_set_data(&data, value, None)
    };
    let read = || async { client.get_data(&data).await.unwrap().0 };

    assert!(
        fenced_write(&client, &fence, token(7), set(b"seven"))
            .await
            .unwrap()
            .is_ok()
    );
    assert!(
        fenced_write(&client, &fence, token(7), set(b"seven again"))
            .await
            .unwrap()
            .is_ok()
    );
    let refused = fenced_write(&client, &fence, token(6), set(b"six"))
        .await
        .unwrap();
    assert_eq!(refused.unwrap_err().highest, token(7));
    assert_eq!(read().await, b"seven again");
    assert!(
        fenced_write(&client, &fence, token(9), set(b"nine"))
            .await
            .unwrap()
            .is_ok()
    );
    assert_eq!(client.get_data(&fence).await.unwrap().0, b"9");

    // The write fails (its node is missing): nothing is written, the fence
    // included, so token 10 did not move it.
    let missing = format!("{base}/missing");
    let failed = fenced_write(&client, &fence, token(10), |multi| {
        multi.add_set_data(&missing, b"x", None)
    })
    .await;
    assert!(matches!(failed, Err(LockError::Store { .. })), "{failed:?}");
    assert_eq!(client.get_data(&fence).await.unwrap().0, b"9");
    assert!(
        fenced_write(&client, &fence, token(9), set(b"nine again"))
            .await
            .unwrap()
            .is_ok()
    );
}

/// Writers racing with tokens 1..=16: every accepted write was, when it was
/// applied, the newest so far; the data ends with the highest token's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_apply_an_older_token_after_a_newer_one() {
    let store = zookeeper::shared();
    let client = raw(&store.endpoint()).await;
    let base = format!("/zk-fenced-race-{}", uuid::Uuid::new_v4().simple());
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create(&base, &[], &open).await.unwrap();
    let (fence, log) = (format!("{base}/fence"), format!("{base}/log"));
    client.create(&log, &[], &open).await.unwrap();
    let writers: Vec<_> = (1..=16_u64)
        .map(|n| {
            let (fence, log, url) = (fence.clone(), log.clone(), store.endpoint());
            tokio::spawn(async move {
                let client = raw(&url).await;
                // Each accepted write appends its token to the log.
                let entry = format!("{log}/w-");
                let mode = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
                let written = fenced_write(&client, &fence, token(n), |multi| {
                    multi.add_create(&entry, n.to_string().as_bytes(), &mode)
                })
                .await
                .unwrap();
                written.is_ok()
            })
        })
        .collect();
    let mut accepted = 0;
    for writer in writers {
        accepted += usize::from(writer.await.unwrap());
    }
    let mut entries = client.list_children(&log).await.unwrap();
    entries.sort();
    let mut applied = Vec::new();
    for entry in &entries {
        let (data, _) = client.get_data(&format!("{log}/{entry}")).await.unwrap();
        applied.push(String::from_utf8(data).unwrap().parse::<u64>().unwrap());
    }
    assert_eq!(applied.len(), accepted);
    assert!(
        applied.windows(2).all(|w| w[0] < w[1]),
        "applied out of token order: {applied:?}"
    );
    assert_eq!(applied.last(), Some(&16));
    assert_eq!(client.get_data(&fence).await.unwrap().0, b"16");
}

/// Floors at and past the largest accepted one are `InvalidConfig` at once,
/// through the trait and through `admin::raise_fence_floor`, even with the
/// store cut off (a request would hang); the floor node is untouched and
/// the next fence is where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_past_the_counter_is_refused_before_any_io() {
    let (proxy, backend, observer) = behind_proxy().await;
    let caps = backend.capabilities();
    assert_eq!(caps.max_fence, i64::MAX as u64);
    let largest = caps.max_fence_floor();
    assert_eq!(
        largest,
        i64::MAX as u64 - Capabilities::FENCE_FLOOR_HEADROOM
    );
    let name = unique("floor-refused");
    let before = take(&backend, &name).await;
    backend.release(&before).await.unwrap();
    let floor_node = format!("{}/%floor", backend.config().root_path());
    let floor_before = observer.check_stat(&floor_node).await.unwrap();

    proxy.set(Mode::Blackhole);
    for floor in [largest + 1, i64::MAX as u64, u64::MAX] {
        let floor = FencingToken::new(floor).unwrap();
        let started = Instant::now();
        let direct = backend.raise_fence_floor(floor).await;
        let audited = lockcore::admin::raise_fence_floor(&backend, floor).await;
        let took = started.elapsed();
        for (how, refused) in [("raise_fence_floor", direct), ("admin", audited)] {
            match refused {
                Err(e @ LockError::InvalidConfig { .. }) => {
                    assert!(e.to_string().contains(&largest.to_string()), "{how}: {e}")
                }
                other => panic!("{how}({floor}): expected InvalidConfig, got {other:?}"),
            }
        }
        assert!(
            took < scaled(Duration::from_millis(100)),
            "refusing {floor} took {took:?}: it waited for the store"
        );
    }
    proxy.set(Mode::Pass);
    assert_eq!(
        observer
            .check_stat(&floor_node)
            .await
            .unwrap()
            .map(|s| s.mzxid),
        floor_before.map(|s| s.mzxid),
        "a refused floor wrote the floor node"
    );
    let after = take(&backend, &name).await;
    assert!(
        after.fence().get() < largest / 2,
        "a refused floor moved the next fence to {}",
        after.fence()
    );
    backend.release(&after).await.unwrap();
}

/// On a private server: raising the floor to the largest accepted value,
/// locks (a used and a fresh name) and permits are still granted, with
/// fences above the floor, within `max_fence`, and growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_floor_accepted_still_lets_grants_happen() {
    if !crate::support::may_launch_servers("the_largest_floor_accepted_still_lets_grants_happen") {
        return;
    }
    let store = tokio::task::spawn_blocking(|| zookeeper::start(zookeeper::Options::default()))
        .await
        .unwrap()
        .unwrap();
    let (a, admin) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let caps = a.capabilities();
    let largest = FencingToken::new(caps.max_fence_floor()).unwrap();
    let (used, fresh, permits) = (
        unique("floor-max"),
        unique("floor-max-fresh"),
        unique("floor-max-permits"),
    );
    let earlier = take(&a, &used).await;
    a.release(&earlier).await.unwrap();
    admin.raise_fence_floor(largest).await.unwrap();
    let mut last = largest;
    for round in 0..3 {
        for name in [&used, &fresh] {
            let lease = take(&a, name).await;
            a.release(&lease).await.unwrap();
            assert!(
                lease.fence() > last && lease.fence().get() <= caps.max_fence,
                "round {round}: {name} granted fence {} after {last} (floor {largest}, max {})",
                lease.fence(),
                caps.max_fence
            );
            last = lease.fence();
        }
        let request = LockRequest::new(permits.clone(), earlier.ttl());
        let permit = a
            .try_acquire_permit(&request, 2)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        a.release(&permit).await.unwrap();
        assert!(permit.fence() > largest && permit.fence().get() <= caps.max_fence);
    }
    eprintln!("fences after the largest floor {largest}: up to {last}");
}

/// A raise of the floor that a client sees while connected (its watch on
/// the floor fires) retires nothing: no restore can have come in between.
/// The client's lock stays held and renews, and its next grant, on the
/// same session, is above the floor. Only a floor changed across a break
/// of the connection retires a session (`restore.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_seen_while_connected_retires_no_session() {
    let store = zookeeper::shared();
    // A root of its own: the floor raised here is this test's alone.
    let root = format!(
        "/zk-tests-raised-connected-{}",
        uuid::Uuid::new_v4().simple()
    );
    let client = connect_with(&store.endpoint(), |c| c.root(root.clone()))
        .await
        .unwrap();
    let operator = connect_with(&store.endpoint(), |c| c.root(root.clone()))
        .await
        .unwrap();
    let held = take(&client, &unique("raised-connected-held")).await;
    let session = session_id(&client);
    let floor = FencingToken::new(held.fence().get() + 1_000_000).unwrap();
    operator.raise_fence_floor(floor).await.unwrap();
    let next = take(&client, &unique("raised-connected-next")).await;
    assert!(next.fence() > floor, "granted under the floor");
    assert_eq!(session_id(&client), session, "the session was retired");
    let renewed = client.renew(&held).await;
    assert!(
        renewed.is_ok(),
        "the held lock after the raise: {renewed:?}"
    );
    assert!(
        !held.loss_signal().unwrap().is_cancelled(),
        "the held lock was lost"
    );
    client.release(&next).await.unwrap();
    client.release(&held).await.unwrap();
}

/// On a private server (a raised floor retires other sessions): a floor
/// raise whose request is lost on a connection that lives on (a proxy drops
/// it) ends within the session timeout, done or `Unavailable`, instead of
/// waiting for a reply as long as the session lives; once the link heals,
/// the same raise goes through on the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_raise_whose_request_is_lost_ends_within_the_session_timeout() {
    if !crate::support::may_launch_servers(
        "a_floor_raise_whose_request_is_lost_ends_within_the_session_timeout",
    ) {
        return;
    }
    let store = tokio::task::spawn_blocking(|| zookeeper::start(zookeeper::Options::default()))
        .await
        .unwrap()
        .unwrap();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let a = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    let session = session_id(&a);
    let limit = a.session_timeout() + scaled(Duration::from_secs(2));
    let floor = token(1_000_000);
    proxy.set(Mode::DropUpstream);
    let raising = tokio::spawn({
        let a = a.clone();
        timeout(limit, async move { a.raise_fence_floor(floor).await })
    });
    tokio::time::sleep(silent_drop(&a)).await;
    proxy.set(Mode::Pass);
    let ended = raising.await.unwrap();
    let ended = ended.unwrap_or_else(|_| panic!("the floor raise still waited after {limit:?}"));
    if let Err(error) = ended {
        assert!(error.is_retryable(), "the raise failed for good: {error}");
    }
    let again = timeout(limit, a.raise_fence_floor(floor)).await;
    let again = again.unwrap_or_else(|_| panic!("the raise got no answer after healing"));
    again.unwrap_or_else(|e| panic!("the raise failed after healing: {e}"));
    assert_eq!(
        session_id(&a),
        session,
        "the raise was lost on one session that lived on"
    );
}

/// A fenced write whose read of the fence lost its reply with the
/// connection reads it again once the connection is back, and writes;
/// one through a fence node it may not read fails with the store's refusal
/// at once, instead of reading again as if the fence kept moving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_reads_the_fence_again_only_after_a_lost_connection() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = raw(&store.endpoint_via(proxy.addr())).await;
    let observer = raw(&store.endpoint()).await;
    let base = format!("/zk-fenced-{}", uuid::Uuid::new_v4().simple());
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.create(&base, &[], &open).await.unwrap();
    let (fence, data) = (format!("{base}/fence"), format!("{base}/data"));
    observer.create(&data, b"none", &open).await.unwrap();

    let sid = client.session_id().0;
    let before = answered(store.addr(), sid);
    proxy.set(Mode::DelayDownstream {
        base: scaled(Duration::from_secs(5)),
        jitter: Duration::ZERO,
    });
    let writing = tokio::spawn({
        let (client, fence, data) = (client.clone(), fence.clone(), data.clone());
        async move {
            let set = |multi: &mut zk::MultiWriter<'_>| multi.add_set_data(&data, b"written", None);
            fenced_write(&client, &fence, token(3), set).await
        }
    });
    eventually(scaled(Duration::from_secs(5)), "the fence read", || async {
        (answered(store.addr(), sid) > before).then_some(())
    })
    .await;
    proxy.set(Mode::Reset);
    eventually(
        scaled(Duration::from_secs(5)),
        "the connection broken",
        || async { connections(store.addr(), sid).is_empty().then_some(()) },
    )
    .await;
    proxy.set(Mode::Pass);
    let written = timeout(scaled(Duration::from_secs(10)), writing)
        .await
        .expect("the write ends once the connection is back")
        .unwrap();
    assert!(matches!(written, Ok(Ok(_))), "{written:?}");
    assert_eq!(observer.get_data(&data).await.unwrap().0, b"written");

    let hidden = format!("{base}/hidden");
    let write_only = [zk::Acl::new(zk::Permission::WRITE, zk::AuthId::anyone())];
    let write_only = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&write_only));
    observer.create(&hidden, b"1", &write_only).await.unwrap();
    let set = |multi: &mut zk::MultiWriter<'_>| multi.add_set_data(&data, b"hidden", None);
    let refused = fenced_write(&client, &hidden, token(4), set).await;
    assert!(
        matches!(&refused, Err(LockError::Store { .. })),
        "a fence node it may not read: {refused:?}"
    );
    assert_eq!(observer.get_data(&data).await.unwrap().0, b"written");
}
