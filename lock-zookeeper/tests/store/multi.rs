//! Multi-locks (`try_acquire_each`): one `multi` per attempt, every name or
//! none. What a refused attempt leaves (nothing) and what a granted one
//! writes (a lock's node in every queue, one zxid for every fence), fences
//! above a raised floor, a waiting multi-lock's requests, a lost reply.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, zk};
use lockcore::backend::LockRequest;
use lockcore::{AttemptEach, FencingToken, HolderLabel, Lease, LockBackend, LockName};
use tokio::time::{Instant, timeout};
use uuid::Uuid;

use crate::support::{
    answered, children, connect, connect_with, delete_parent, lasting_parent, locker, raw,
    round_trip, session_id, take, unique,
};

/// A request per name, in sorted order, as `Locker::acquire_all` asks.
fn requests(backend: &ZooKeeperBackend, names: &[&LockName]) -> Vec<LockRequest> {
    let ttl = backend
        .capabilities()
        .effective_ttl(backend.session_timeout())
        .unwrap();
    let mut names = names.to_vec();
    names.sort();
    (names.into_iter())
        .map(|n| LockRequest::new(n.clone(), ttl).with_label(HolderLabel::new("multi").unwrap()))
        .collect()
}

/// Every lock of `names`, which must be free.
async fn take_all(backend: &ZooKeeperBackend, names: &[&LockName]) -> Vec<Lease> {
    match backend
        .try_acquire_each(&requests(backend, names))
        .await
        .unwrap()
    {
        AttemptEach::Acquired(leases) => leases,
        AttemptEach::Held { name, .. } => panic!("{name} was expected to be free"),
    }
}

/// The `czxid` of the only node under `parent`, and its name.
async fn only_node(observer: &zk::Client, parent: &str) -> (String, i64) {
    let nodes = children(observer, parent).await;
    assert_eq!(nodes.len(), 1, "{parent}: {nodes:?}");
    let stat = observer.check_stat(&format!("{parent}/{}", nodes[0])).await;
    (nodes[0].clone(), stat.unwrap().unwrap().czxid)
}

/// A name held by another client refuses the attempt, and it writes
/// nothing: the empty parent of a free name is neither deleted nor created
/// again, a missing one stays missing, the held queue keeps its one node.
/// Once the name is free, one attempt takes all three: in each queue a
/// lock's node of the lease's owner, numbered 0 (the parent created again),
/// each fence that node's `czxid`, the same for all, above the earlier
/// holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_writes_nothing() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let (x, y, z) = (unique("multi-x"), unique("multi-y"), unique("multi-z"));
    let parents = [&x, &y, &z].map(|n| b.lock_path(n));
    // A parent the server's sweep leaves alone (a plain persistent node).
    lasting_parent(&observer, &parents[0]).await;
    let empty = observer.check_stat(&parents[0]).await.unwrap();
    let held = take(&a, &z).await;
    let queued = children(&observer, &parents[2]).await;

    match b
        .try_acquire_each(&requests(&b, &[&x, &y, &z]))
        .await
        .unwrap()
    {
        AttemptEach::Held { name, expires_in } => {
            assert_eq!((name, expires_in), (z.clone(), None));
        }
        AttemptEach::Acquired(leases) => panic!("granted beside a holder: {leases:?}"),
    }
    assert_eq!(observer.check_stat(&parents[0]).await.unwrap(), empty);
    assert!(children(&observer, &parents[0]).await.is_empty());
    assert!(observer.check_stat(&parents[1]).await.unwrap().is_none());
    assert_eq!(children(&observer, &parents[2]).await, queued);

    a.release(&held).await.unwrap();
    let leases = take_all(&b, &[&x, &y, &z]).await;
    let mut fences = Vec::new();
    for (lease, parent) in leases.iter().zip(&parents) {
        let (node, czxid) = only_node(&observer, parent).await;
        let owner = lease.owner().as_uuid().hyphenated().to_string();
        assert_eq!(node, format!("_c_{owner}-lock-0000000000"));
        assert_eq!(lease.fence().get(), czxid as u64);
        fences.push(lease.fence());
    }
    assert!(fences.windows(2).all(|w| w[0] == w[1]), "{fences:?}");
    assert!(fences[2] > held.fence());
    for lease in &leases {
        b.release(lease).await.unwrap();
    }
    // A container now, as every parent the attempt created: maybe swept.
    delete_parent(&observer, &parents[0]).await;
}

/// Under a lock root of its own: once the fence floor is raised, a
/// multi-lock's fences are above it, and its nodes carry the offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_above_a_raised_fence_floor() {
    let store = zookeeper::shared();
    let root = format!("/zk-tests-multi-floor-{}", Uuid::new_v4().simple());
    let a = connect_with(&store.endpoint(), |c| c.root(root.clone()))
        .await
        .unwrap();
    let observer = raw(&store.endpoint()).await;
    let (x, y) = (unique("multi-floor-x"), unique("multi-floor-y"));
    let earlier = take(&a, &x).await;
    a.release(&earlier).await.unwrap();
    let floor = FencingToken::new(earlier.fence().get() + 1_000_000_000).unwrap();
    a.raise_fence_floor(floor).await.unwrap();
    let leases = take_all(&a, &[&x, &y]).await;
    for lease in &leases {
        assert!(lease.fence() > floor, "{} under {floor}", lease.fence());
        let parent = a.lock_path(lease.name());
        let (node, _) = only_node(&observer, &parent).await;
        let (data, _) = observer
            .get_data(&format!("{parent}/{node}"))
            .await
            .unwrap();
        let data = String::from_utf8(data).unwrap();
        assert!(data.starts_with("multi\nfence-offset="), "{data:?}");
        a.release(lease).await.unwrap();
    }
}

/// A multi-lock waiting for one held name sends almost nothing while
/// nothing changes: its free names' wake-ups wait for their queues to
/// change instead of firing at once (it would try again and again). Once
/// the held name is released, it gets every name within a round trip or
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_multi_lock_is_quiet() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let (x, y, z) = (unique("quiet-x"), unique("quiet-y"), unique("quiet-z"));
    let held = take(&a, &z).await;
    let names = [x.clone(), y.clone(), z.clone()];
    let waiting = tokio::spawn({
        let locker = locker(&b);
        async move { locker.acquire_all(&names).await }
    });
    tokio::time::sleep(scaled(Duration::from_millis(300))).await;
    let sid = session_id(&b);
    let (before, since) = (answered(store.addr(), sid), Instant::now());
    tokio::time::sleep(scaled(Duration::from_millis(1500))).await;
    let sent = answered(store.addr(), sid) - before;
    let per_second = sent as f64 / since.elapsed().as_secs_f64();
    eprintln!(
        "a waiting multi-lock sent {sent} requests in {:?}",
        since.elapsed()
    );
    // One attempt per re-check (1 s) costs about a dozen requests.
    assert!(
        per_second < 30.0,
        "{sent} requests in {:?}",
        since.elapsed()
    );

    let released = Instant::now();
    a.release(&held).await.unwrap();
    let within = round_trip(&b).await * 2 + scaled(Duration::from_millis(500));
    let all = timeout(within, waiting)
        .await
        .expect("granted soon after the release")
        .unwrap()
        .unwrap();
    eprintln!("granted {:?} after the release", released.elapsed());
    assert!(
        all.fencing_token(z.as_str())
            .is_some_and(|f| f > held.fence())
    );
    all.release().await.unwrap();
}

/// Multi-locks and single locks race on the same names (single lockers
/// taking a name alone again and again, so by the sequence proof too,
/// while multi-locks delete and create those parents again): no name is
/// ever held by two at once, and every taker is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_and_multi_locks_never_overlap() {
    const ROUNDS: usize = 15;
    let store = zookeeper::shared();
    let (a, b, c) = (unique("race-a"), unique("race-b"), unique("race-c"));
    let sets = [
        vec![a.clone(), b.clone()],
        vec![b.clone(), c.clone()],
        vec![a.clone()],
        vec![c.clone()],
        vec![a.clone(), b.clone(), c.clone()],
    ];
    let in_use = Arc::new(Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for set in sets {
        let locker = locker(&connect(store.endpoint()).await.unwrap());
        let in_use = in_use.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guards = match set.as_slice() {
                    [one] => vec![locker.acquire(one).await.unwrap()],
                    _ => locker.acquire_all(&set).await.unwrap().into_guards(),
                };
                for name in &set {
                    let fresh = in_use.lock().unwrap().insert(name.clone());
                    assert!(fresh, "{name} granted to {set:?} while held");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                in_use.lock().unwrap().retain(|n| !set.contains(n));
                for guard in guards {
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        timeout(scaled(Duration::from_secs(60)), task)
            .await
            .expect("every taker served")
            .unwrap();
    }
}

/// Every reply is lost from the start of an attempt: it gets no answer,
/// and whatever it wrote keeps another client out of no name longer than
/// TTL + slack; once the network heals, its client gets definite answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_blocks_the_names_no_longer_than_a_ttl() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let a = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    let b = connect(store.endpoint()).await.unwrap();
    let (x, y) = (unique("multi-lost-x"), unique("multi-lost-y"));
    let ttl = a.session_timeout();
    let bound = ttl + b.capabilities().expiry_slack + round_trip(&b).await;

    proxy.set(Mode::DropDownstream);
    let cut = Instant::now();
    let blind = timeout(bound, a.try_acquire_each(&requests(&a, &[&x, &y]))).await;
    assert!(
        !matches!(blind, Ok(Ok(_))),
        "an answer through a proxy that drops replies: {blind:?}"
    );
    let both = locker(&b)
        .acquire_all_timeout([&x, &y], bound.saturating_sub(cut.elapsed()))
        .await
        .expect("both names within TTL + slack of the lost reply");
    eprintln!(
        "the names were free {:?} after the lost reply",
        cut.elapsed()
    );

    proxy.set(Mode::Pass);
    eventually(
        scaled(Duration::from_secs(10)),
        "a definite refusal",
        || async {
            match a.try_acquire_each(&requests(&a, &[&x, &y])).await {
                Ok(AttemptEach::Held { .. }) => Some(()),
                Ok(AttemptEach::Acquired(leases)) => panic!("granted beside a holder: {leases:?}"),
                Err(e) if e.is_retryable() => None,
                Err(e) => panic!("after healing: {e}"),
            }
        },
    )
    .await;
    both.release().await.unwrap();
}
