//! Reader-writer locks in etcd: grants are keys under `held/`, waiters
//! under `line/` (a writer's entry is its intent), each attached to its
//! client's session; every grant is a new key whose create revision (plus
//! the fence offset) is its fence. What the conformance suite cannot see:
//! the keys themselves, a dead writer's intent lapsing with its session, a
//! raised fence floor under a writer already in line, and a grant whose
//! reply was lost.

use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::etcd;
use lock_etcd::etcd_client::{Client, GetOptions, KeyValue};
use lock_etcd::testing::key_of;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{Kind, LockRequest};
use lockcore::{
    Access, Attempt, FencingToken, HolderLabel, Lease, LockBackend, LockName, ReleaseOutcome,
};
use tokio::time::Instant;

use crate::support::*;

const TTL: Duration = Duration::from_secs(4);

fn request(backend: &EtcdBackend, name: &LockName, access: Access, label: &str) -> LockRequest {
    let ttl = backend.capabilities().effective_ttl(TTL).unwrap();
    LockRequest::new(name.clone(), ttl)
        .with_label(HolderLabel::new(label).unwrap())
        .with_access(access)
}

async fn take(backend: &EtcdBackend, name: &LockName, access: Access, label: &str) -> Lease {
    match backend
        .try_acquire(&request(backend, name, access, label))
        .await
        .unwrap()
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("the {access} of {name} should be granted"),
    }
}

async fn refused(backend: &EtcdBackend, name: &LockName, access: Access) -> bool {
    let asked = request(backend, name, access, "refused");
    matches!(
        backend.try_acquire(&asked).await.unwrap(),
        Attempt::Held { .. }
    )
}

/// Waits (in the background) for `access`, for up to 30 s.
fn wait_for(
    backend: &EtcdBackend,
    name: &LockName,
    access: Access,
    label: &str,
) -> tokio::task::JoinHandle<Lease> {
    let (backend, asked) = (backend.clone(), request(backend, name, access, label));
    tokio::spawn(async move {
        let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(30));
        backend
            .acquire(&asked, &wait)
            .await
            .unwrap()
            .expect("granted")
    })
}

/// Every key under `prefix`, by create revision.
async fn keys_under(raw: &mut Client, prefix: &str) -> Vec<KeyValue> {
    let mut kvs = raw
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .take_kvs();
    kvs.sort_by_key(KeyValue::create_revision);
    kvs
}

/// The keys under `prefix`, relative to it, by create revision.
async fn layout(raw: &mut Client, prefix: &str) -> Vec<String> {
    keys_under(raw, prefix)
        .await
        .iter()
        .map(|kv| kv.key_str().unwrap()[prefix.len()..].to_owned())
        .collect()
}

/// Whether `key` (relative to the lock's keys) is a grant or waiter of
/// `what` (`held/read`, `line/write`, ...) named `<session, 16 hex>.<n>`.
fn is(key: &str, what: &str) -> bool {
    key.strip_prefix(what)
        .and_then(|rest| rest.strip_prefix('/'))
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(session, n)| session.len() == 16 && n.parse::<u32>().is_ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_waiters_are_keys_and_a_grants_create_revision_is_its_fence() {
    let url = etcd::shared().endpoint();
    let prefix = format!("rw-test-{:08x}/", rand_u32());
    let config = EtcdConfig::new([url.as_str()]).prefix(prefix.clone());
    let (a, b) = (
        EtcdBackend::connect_with(config.clone()).await.unwrap(),
        EtcdBackend::connect_with(config).await.unwrap(),
    );
    let mut raw = raw(&url).await;
    let name = LockName::new("prices/eu").unwrap();
    let base = format!("{prefix}/rw/prices%2Feu/");

    // Readers share: one key each under held/read/, on its session.
    let first = take(&a, &name, Access::Read, "first").await;
    let second = take(&b, &name, Access::Read, "second").await;
    assert_eq!(first.access(), Some(Access::Read));
    let held = keys_under(&mut raw, &base).await;
    assert_eq!(held.len(), 2);
    for (kv, lease) in held.iter().zip([&first, &second]) {
        let key = kv.key_str().unwrap()[base.len()..].to_owned();
        assert!(is(&key, "held/read"), "{key}");
        assert_eq!(kv.create_revision() as u64, lease.fence().get());
        assert_ne!(kv.lease(), 0, "attached to the holder's session");
        assert_eq!(Some(kv.key().to_vec()), key_of(lease));
    }
    let holders = a.holders(&name, Kind::ReadWrite).await.unwrap();
    let seen: Vec<_> = holders
        .iter()
        .map(|h| (h.access, h.fence, h.label.as_ref().unwrap().as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (Some(Access::Read), first.fence(), "first"),
            (Some(Access::Read), second.fence(), "second")
        ]
    );
    assert!(holders.iter().all(|h| h.expires_in.is_some()));
    // The lock and the semaphore of the name are apart.
    assert!(a.holders(&name, Kind::Lock).await.unwrap().is_empty());
    assert!(a.holders(&name, Kind::Semaphore).await.unwrap().is_empty());
    // A writer that does not wait leaves nothing behind.
    assert!(refused(&b, &name, Access::Write).await);
    assert_eq!(keys_under(&mut raw, &base).await.len(), 2);

    // A writer waits in line: its entry is its intent, readers after it
    // wait behind it.
    let writer = wait_for(&b, &name, Access::Write, "writer");
    until(scaled(Duration::from_secs(5)), "the writer in line", || {
        let (mut raw, base) = (raw.clone(), base.clone());
        async move { layout(&mut raw, &base).await.len() == 3 }
    })
    .await;
    assert!(
        refused(&a, &name, Access::Read).await,
        "a reader passed the writer's intent"
    );
    let reader = wait_for(&a, &name, Access::Read, "reader");
    until(scaled(Duration::from_secs(5)), "the reader in line", || {
        let (mut raw, base) = (raw.clone(), base.clone());
        async move { layout(&mut raw, &base).await.len() == 4 }
    })
    .await;
    let keys = layout(&mut raw, &base).await;
    assert!(
        is(&keys[2], "line/write") && is(&keys[3], "line/read"),
        "{keys:?}"
    );

    // The readers go: the writer's grant is a new key, its fence above both.
    a.release(&first).await.unwrap();
    b.release(&second).await.unwrap();
    let write = tokio::time::timeout(scaled(Duration::from_secs(5)), writer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(write.access(), Some(Access::Write));
    assert!(write.fence() > second.fence());
    let kvs = keys_under(&mut raw, &base).await;
    let keys = layout(&mut raw, &base).await;
    assert!(
        is(&keys[0], "line/read") && is(&keys[1], "held/write"),
        "{keys:?}"
    );
    assert_eq!(kvs[1].create_revision() as u64, write.fence().get());
    assert_eq!(
        a.holders(&name, Kind::ReadWrite).await.unwrap()[0].access,
        Some(Access::Write)
    );
    // Its renewal keeps the fence.
    assert_eq!(b.renew(&write).await.unwrap().fence(), write.fence());

    // Then the reader that waited behind it, with a larger fence still.
    assert_eq!(b.release(&write).await.unwrap(), ReleaseOutcome::Released);
    let read = tokio::time::timeout(scaled(Duration::from_secs(5)), reader)
        .await
        .unwrap()
        .unwrap();
    assert!(read.fence() > write.fence());
    assert_eq!(b.release(&write).await.unwrap(), ReleaseOutcome::NotHeld);
    a.release(&read).await.unwrap();
    assert!(layout(&mut raw, &base).await.is_empty(), "keys left behind");
}

/// A writer that stops waiting (its future dropped) deletes its entry;
/// one whose client is cut off from etcd (as good as dead: nothing
/// refreshes its session) keeps readers out only until etcd expires its
/// session, within its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_writers_intent_lapses_with_its_session() {
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let doomed = EtcdBackend::connect_with(EtcdConfig::new([store.endpoint_via(proxy.addr())]))
        .await
        .unwrap();
    let client = connect(&store.endpoint()).await;
    let name = name("rw-dead-writer");
    let held = take(&client, &name, Access::Read, "holder").await;
    let intent_shows = || async {
        until(
            scaled(Duration::from_secs(5)),
            "the writer's intent",
            || async { refused(&client, &name, Access::Read).await },
        )
        .await;
    };

    // Dropped: its entry goes at once.
    let dropped = wait_for(&doomed, &name, Access::Write, "dropped");
    intent_shows().await;
    dropped.abort();
    let _ = dropped.await;
    eventually(
        scaled(Duration::from_secs(2)),
        "a reader once the dropped writer left",
        || async {
            let asked = request(&client, &name, Access::Read, "after");
            client.try_acquire(&asked).await.ok()?.into_lease()
        },
    )
    .await;

    // Cut off: readers wait for its session to expire.
    let cut = wait_for(&doomed, &name, Access::Write, "cut off");
    intent_shows().await;
    proxy.set(Mode::Blackhole);
    let since = Instant::now();
    let slack = client.capabilities().slack_for(TTL) + scaled(Duration::from_secs(1));
    let wait = WaitPolicy::new(Instant::now() + TTL + slack);
    let read = client
        .acquire(&request(&client, &name, Access::Read, "reader"), &wait)
        .await
        .unwrap()
        .expect("the dead writer's intent lapsed within its TTL + slack");
    // The keeper refreshed the session at most a third of a TTL before.
    let waited = since.elapsed();
    assert!(
        waited >= TTL / 2,
        "granted {waited:?} in: the intent kept nobody out"
    );
    assert!(waited <= TTL + slack, "{waited:?}");
    cut.abort();
    proxy.set(Mode::Pass);
    client.release(&read).await.unwrap();
    client.release(&held).await.unwrap();
}

/// A writer already in line when the fence floor is raised is granted a
/// fence above it: grants are written when they are decided, under the
/// floor in force then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_stay_above_a_floor_raised_while_a_writer_waits() {
    let url = etcd::shared().endpoint();
    let config = EtcdConfig::new([url.as_str()]).prefix(format!("rw-floor-{:08x}/", rand_u32()));
    let (a, b) = (
        EtcdBackend::connect_with(config.clone()).await.unwrap(),
        EtcdBackend::connect_with(config).await.unwrap(),
    );
    let name = name("rw-floor");
    let read = take(&a, &name, Access::Read, "reader").await;
    let writer = wait_for(&b, &name, Access::Write, "writer");
    until(
        scaled(Duration::from_secs(5)),
        "the writer in line",
        || async { refused(&a, &name, Access::Read).await },
    )
    .await;
    let floor = FencingToken::new(read.fence().get() + 1_000_000_000).unwrap();
    a.raise_fence_floor(floor).await.unwrap();
    a.release(&read).await.unwrap();
    let write = tokio::time::timeout(scaled(Duration::from_secs(5)), writer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        write.fence() > floor,
        "{} under the floor {floor}",
        write.fence()
    );
    let seen = a.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(seen[0].fence, write.fence(), "holders agree on the fence");
    b.release(&write).await.unwrap();
    let next = take(&a, &name, Access::Read, "next").await;
    assert!(next.fence() > write.fence());
    a.release(&next).await.unwrap();
}

/// A read granted in etcd whose reply never reached the client retires the
/// client's session: the unseen grant goes with it, and a writer has the
/// name within the reply's delay + TTL + slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_reply_blocks_writers_no_longer_than_a_ttl() {
    let store = etcd::shared();
    let timeout = scaled(Duration::from_millis(500));
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = EtcdBackend::connect_with(
        EtcdConfig::new([store.endpoint_via(proxy.addr())]).request_timeout(timeout),
    )
    .await
    .unwrap();
    let observer = connect(&store.endpoint()).await;
    let name = name("rw-lost-reply");
    // A session in use before the replies turn late.
    let warm = take(&client, &name, Access::Read, "warm").await;
    client.release(&warm).await.unwrap();

    let late = timeout * 2;
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    let sent = Instant::now();
    let asked = request(&client, &name, Access::Read, "phantom");
    let err = client.try_acquire(&asked).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    proxy.set(Mode::Pass);
    until(
        scaled(Duration::from_secs(5)),
        "the landed grant",
        || async {
            !observer
                .holders(&name, Kind::ReadWrite)
                .await
                .unwrap()
                .is_empty()
        },
    )
    .await;
    let slack = client.capabilities().slack_for(TTL) + scaled(Duration::from_secs(1));
    let within = (sent + late + TTL + slack).saturating_duration_since(Instant::now());
    let write = eventually(within, "the phantom read gone", || async {
        let asked = request(&observer, &name, Access::Write, "writer");
        observer.try_acquire(&asked).await.ok()?.into_lease()
    })
    .await;
    observer.release(&write).await.unwrap();
}

/// A read share whose remaining time is set leaves its session for a lease
/// of its own and keeps its fence; closing the client loses the shares it
/// still holds on its sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_take_a_set_remaining_time_and_are_lost_at_close() {
    let url = etcd::shared().endpoint();
    let client = connect(&url).await;
    let mut raw = raw(&url).await;
    let name = name("rw-remaining");
    let locker = lockcore::Locker::new(client.clone()).ttl(TTL);
    let rw = locker.rw_lock(&name).unwrap();
    let kept = rw.read().await.unwrap();
    let key = key_of(&kept.lease()).unwrap();
    let session = etcd_lease_of(&mut raw, &key).await;
    let remaining = client
        .capabilities()
        .effective_remaining(Duration::from_secs(30))
        .unwrap();
    let moved = client
        .set_remaining(&kept.lease(), remaining)
        .await
        .unwrap();
    assert_eq!(moved.fence(), kept.fencing_token());
    assert_ne!(etcd_lease_of(&mut raw, &key).await, session);
    let lost = rw.read().await.unwrap();
    assert_eq!(lost.access(), Some(Access::Read));
    client.close().await.unwrap();
    tokio::time::timeout(scaled(Duration::from_secs(2)), lost.lost())
        .await
        .expect("a share lost at close");
    // The share on a lease of its own outlives the client.
    let observer = connect(&url).await;
    let seen = observer.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].fence, kept.fencing_token());
    let mut raw = raw.clone();
    raw.delete(key, None).await.unwrap();
}

/// A write hand-off costs etcd the release, the next writer's grant and at
/// most one refused `Txn` (the writer behind it, whose last blocker the
/// grant deleted): a waiting writer acts only once every key that refused
/// it is gone, not on every delete of the name. Before, each release woke
/// every waiting writer, one `Txn` each: 60 `Txn`s for these 8 hand-offs,
/// against 21 now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_hand_off_wakes_one_waiting_writer_not_all() {
    const WRITERS: usize = 8;
    let store = private_etcd().await;
    let url = store.endpoint();
    let mut raw = raw(&url).await;
    let name = name("writer-herd");
    let holder = connect(&url).await;
    let first = take(&holder, &name, Access::Write, "holder").await;
    let base = {
        let key = String::from_utf8(key_of(&first).unwrap()).unwrap();
        key[..key.find("held/").unwrap()].to_owned()
    };
    let mut writers = Vec::new();
    for i in 0..WRITERS {
        let backend = connect(&url).await;
        writers.push((wait_for(&backend, &name, Access::Write, "writer"), backend));
        until(scaled(Duration::from_secs(5)), "the writer in line", || {
            let (mut raw, base) = (raw.clone(), base.clone());
            async move { layout(&mut raw, &base).await.len() == i + 2 }
        })
        .await;
    }
    let before = metrics(&store).await;
    let mut fence = first.fence();
    holder.release(&first).await.unwrap();
    for (waiter, backend) in writers {
        let lease = tokio::time::timeout(scaled(Duration::from_secs(10)), waiter)
            .await
            .expect("the next writer is granted on the release")
            .unwrap();
        assert!(lease.fence() > fence, "fences grow");
        fence = lease.fence();
        assert_eq!(
            backend.release(&lease).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    let after = metrics(&store).await;
    let txns = handled(&after, "Txn") - handled(&before, "Txn");
    // Per hand-off: the release, the grant, one refused Txn at most.
    let most = (3 * WRITERS + 1) as f64;
    assert!(
        txns <= most,
        "{txns} Txns for {WRITERS} write hand-offs (at most {most}): waiting writers herd"
    );
    assert!(layout(&mut raw, &base).await.is_empty(), "keys left behind");
}
