//! The queue recipe on the wire: what nodes exist, and when they go away.

mod support;

use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::Mode;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, decode_segment, zk};
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{CancellationToken, LockBackendExt};
use lockcore::{Attempt, LockBackend, LockError, LockName, ReleaseOutcome};
use support::{behind_proxy, children, connect, locker, raw, take, unique};
use tokio::time::{Instant, timeout};

/// Waiters that time out, are cancelled, or whose acquire future is simply
/// dropped (even right after it started, with its create possibly still in
/// flight) leave no node behind: only the holder's node remains, and none
/// once it releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_up_waiters_leave_no_queue_nodes() {
    let store = zookeeper::shared();
    let holder = connect(store.endpoint()).await.unwrap();
    let waiter = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("given-up");
    let parent = holder.lock_path(&name);
    let only_holder = || async { (children(&observer, &parent).await.len() == 1).then_some(()) };

    let lease = take(&holder, &name).await;

    // Timed out.
    let timed_out = locker(&waiter)
        .acquire_timeout(&name, Duration::from_millis(300))
        .await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    eventually(
        Duration::from_secs(2),
        "the timed-out waiter's node removed",
        only_holder,
    )
    .await;

    // Cancelled while waiting.
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (locker, name, cancel) = (locker(&waiter), name.clone(), cancel.clone());
        async move { locker.acquire_cancellable(&name, &cancel).await }
    });
    eventually(Duration::from_secs(2), "the waiter queueing", || async {
        (children(&observer, &parent).await.len() == 2).then_some(())
    })
    .await;
    cancel.cancel();
    assert!(matches!(
        task.await.unwrap(),
        Err(LockError::Cancelled { .. })
    ));
    eventually(
        Duration::from_secs(2),
        "the cancelled waiter's node removed",
        only_holder,
    )
    .await;

    // Dropped at once, and dropped mid-wait, many times.
    for round in 0..20 {
        let task = tokio::spawn({
            let (locker, name) = (locker(&waiter), name.clone());
            async move { locker.acquire(&name).await }
        });
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(5 * round)).await;
        }
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    eventually(
        Duration::from_secs(3),
        "every dropped waiter's node removed",
        only_holder,
    )
    .await;

    assert_eq!(
        holder.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    eventually(Duration::from_secs(2), "an empty queue", || async {
        children(&observer, &parent).await.is_empty().then_some(())
    })
    .await;
}

/// The reply to the create of a queue node is lost (the connection breaks
/// after the server created the node): the client finds its own node by the
/// owner uuid in its name instead of creating a second one, and gets the
/// lock with that node's czxid as fence. Nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_reply_finds_its_own_node() {
    let (proxy, a, observer) = behind_proxy().await;
    let name = unique("lost-create-reply");
    let parent = a.lock_path(&name);
    // The parent exists already, so the create is the only write in flight.
    let warm = take(&a, &name).await;
    a.release(&warm).await.unwrap();

    proxy.set(Mode::DropDownstream);
    let attempt = tokio::spawn({
        let (a, name) = (a.clone(), name.clone());
        async move { a.try_acquire_for(&name, a.session_timeout()).await }
    });
    let created = eventually(
        Duration::from_secs(2),
        "the server creating the node",
        || async { children(&observer, &parent).await.pop() },
    )
    .await;
    // The reply is gone; now the connection breaks, and heals.
    proxy.set(Mode::Pass);
    proxy.reset_existing();

    let lease = timeout(a.session_timeout() * 2, attempt)
        .await
        .expect("the attempt completes after reconnecting")
        .unwrap()
        .unwrap()
        .into_lease()
        .expect("the recovered node holds the lock");
    let nodes = children(&observer, &parent).await;
    assert_eq!(
        nodes,
        vec![created.clone()],
        "exactly the one node the server created"
    );
    let (_, stat) = observer
        .get_data(&format!("{parent}/{created}"))
        .await
        .unwrap();
    assert_eq!(
        lease.fence().get(),
        stat.czxid as u64,
        "fence = the node's czxid"
    );
    assert!(created.contains(&lease.owner().as_uuid().hyphenated().to_string()));
    assert!(lease.fence() > warm.fence());
    assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::Released);
    assert!(children(&observer, &parent).await.is_empty());
}

/// A create's reply is lost and replies stay lost for most of a session
/// timeout (the session lives on: the client's reconnection attempts reach
/// the server). The node found again after the connection heals starts its
/// lease from that finding, not from the create sent long before: counted
/// from the create, the lease would be handed out with its deadline already
/// passed. Both grant paths: `try_acquire`, and a waiting `acquire` whose
/// create joins the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_found_after_replies_were_lost_long_starts_a_full_lease() {
    let (proxy, a, observer) = behind_proxy().await;
    let ttl = a.session_timeout();
    for waiting in [false, true] {
        let name = unique("long-lost-create-reply");
        let parent = a.lock_path(&name);
        // The parent exists already, so the create is the only write in flight.
        let warm = take(&a, &name).await;
        a.release(&warm).await.unwrap();

        proxy.set(Mode::DropDownstream);
        let sent = Instant::now();
        let attempt = tokio::spawn({
            let (a, name) = (a.clone(), name.clone());
            async move {
                if waiting {
                    let wait = WaitPolicy::new(Instant::now() + ttl * 3);
                    a.acquire_for(&name, ttl, &wait).await
                } else {
                    a.try_acquire_for(&name, ttl).await.map(Attempt::into_lease)
                }
            }
        });
        eventually(
            Duration::from_secs(2),
            "the server creating the node",
            || async { children(&observer, &parent).await.pop() },
        )
        .await;
        // A client's session clock gives up 7T/5 after its last reply.
        tokio::time::sleep_until(sent + ttl * 7 / 8).await;
        proxy.set(Mode::Pass);
        proxy.reset_existing();

        let lease = timeout(ttl * 2, attempt)
            .await
            .expect("the attempt completes after reconnecting")
            .unwrap()
            .unwrap()
            .expect("the recovered node holds the lock");
        let left = lease.deadline().saturating_duration_since(Instant::now());
        // A lease starts from a proof at most T/4 old; margin and drift take
        // less than T/2 (the session is refused otherwise).
        assert!(
            left >= ttl / 4,
            "waiting={waiting}: the lease was granted with {left:?} left of a {ttl:?} session"
        );
        assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::Released);
        assert!(children(&observer, &parent).await.is_empty());
    }
}

/// When a lock's parent is deleted (as the server's container reaper does
/// once it is empty, see `containers.rs`) and recreated, ZooKeeper restarts
/// its sequence numbers at 0, yet fences keep growing: they are czxids, not
/// sequences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parent_recreation_restarts_sequences_but_never_fences() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("recreated-parent");
    let parent = a.lock_path(&name);

    let mut last = None;
    for _ in 0..5 {
        let lease = take(&a, &name).await;
        assert!(last < Some(lease.fence()));
        last = Some(lease.fence());
        a.release(&lease).await.unwrap();
    }
    // What the server's container reaper does to an empty parent.
    observer.delete(&parent, None).await.unwrap();
    let lease = take(&a, &name).await;
    let nodes = children(&observer, &parent).await;
    assert_eq!(nodes.len(), 1);
    assert!(
        nodes[0].ends_with("-lock-0000000000"),
        "the sequence restarted: {nodes:?}"
    );
    assert!(Some(lease.fence()) > last, "the fence did not restart");
    a.release(&lease).await.unwrap();
}

/// A lease that is neither renewed nor released is deleted by its own
/// client at its local deadline, though the session lives on: an abandoned
/// lease never blocks the name for the life of a long-lived process. Nobody
/// gets the lock before that deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_lease_is_deleted_at_its_deadline() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let name = unique("abandoned");
    let ttl = a.session_timeout();
    let lease = take(&a, &name).await;
    let deadline = lease.deadline();
    drop(lease);
    let wait = WaitPolicy::new(Instant::now() + ttl * 2);
    let next = b
        .acquire_for(&name, ttl, &wait)
        .await
        .unwrap()
        .expect("acquired after the deadline");
    let granted = Instant::now();
    assert!(
        granted >= deadline,
        "granted {:?} before the abandoned lease's deadline",
        deadline - granted
    );
    assert!(
        granted <= deadline + Duration::from_secs(1),
        "freed {:?} after the deadline",
        granted - deadline
    );
    b.release(&next).await.unwrap();
    assert_eq!(
        a.zk_client().unwrap().state(),
        zk::SessionState::SyncConnected,
        "A's session lives on"
    );
}

/// Every lock name is one child of the root, whatever it contains: the
/// segment decodes back to the name, nothing lands outside the root, and
/// the lock node is a direct child of that segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_are_single_children_of_the_root() {
    let store = zookeeper::shared();
    let root = format!("/zk-tests-names-{}", uuid::Uuid::new_v4().simple());
    let a = ZooKeeperBackend::connect_with(
        lock_zookeeper::ZooKeeperConfig::new(store.endpoint())
            .root(root.clone())
            .session_timeout(support::session_timeout()),
    )
    .await
    .unwrap();
    let observer = raw(&store.endpoint()).await;
    let long_x = "x".repeat(255);
    let long_slash = "/".repeat(255);
    let names = [
        "a/b",
        "a%2Fb",
        ".",
        "..",
        "../../escape",
        "/zookeeper/quota",
        "zookeeper",
        "emoji 🔒",
        "\u{e000}private",
        "\u{fff0}",
        "\u{fffd}",
        "Ünïcode",
        &long_x,
        &long_slash,
    ]
    .map(|n| LockName::new(n).unwrap());
    let mut leases = Vec::new();
    for name in &names {
        leases.push(
            a.try_acquire_for(name, a.session_timeout())
                .await
                .unwrap()
                .into_lease()
                .unwrap(),
        );
    }
    let mut segments = children(&observer, &root).await;
    segments.sort();
    assert_eq!(
        segments.len(),
        names.len(),
        "one parent per name: {segments:?}"
    );
    let mut decoded: Vec<String> = segments
        .iter()
        .map(|s| decode_segment(s).unwrap())
        .collect();
    let mut expected: Vec<String> = names.iter().map(|n| n.as_str().to_owned()).collect();
    decoded.sort();
    expected.sort();
    assert_eq!(decoded, expected);
    for name in &names {
        let path = a.lock_path(name);
        assert_eq!(
            path.matches('/').count(),
            root.matches('/').count() + 1,
            "{path}"
        );
        assert_eq!(children(&observer, &path).await.len(), 1, "{path}");
    }
    let outside = children(&observer, "/").await;
    assert!(
        !outside.iter().any(|c| c == "escape" || c == "b"),
        "{outside:?}"
    );
    for lease in &leases {
        a.release(lease).await.unwrap();
    }
    drop(a);
    for s in segments {
        let _ = observer.delete(&format!("{root}/{s}"), None).await;
    }
    let _ = observer.delete(&root, None).await;
}

/// `inspect` and `force_release` see the holder, not a waiter; the forced
/// release deletes exactly the holder's node, the waiter gets the lock
/// next, and the evicted guard learns from its node watch (or, in the
/// first moments of a grant, its next renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_evicts_the_head_and_the_queue_moves_on() {
    let store = zookeeper::shared();
    let (a, b, admin) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("forced");
    let guard = locker(&a).acquire(&name).await.unwrap();
    let waiter = tokio::spawn({
        let (locker, name) = (locker(&b), name.clone());
        async move { locker.acquire(&name).await }
    });
    let parent = a.lock_path(&name);
    eventually(Duration::from_secs(2), "the waiter queueing", || async {
        (children(&observer, &parent).await.len() == 2).then_some(())
    })
    .await;
    let holder = admin.inspect(&name).await.unwrap().unwrap();
    assert_eq!(holder.fence, guard.fencing_token());
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    let evicted = admin.evict(&name, None).await.unwrap().unwrap();
    assert_eq!(evicted.fence, guard.fencing_token());
    let evicted_at = Instant::now();
    let within = a.session_timeout() / 3 + Duration::from_millis(500);
    timeout(within, guard.lost())
        .await
        .expect("the evicted guard learns by its node watch or its next renewal");
    assert!(evicted_at.elapsed() < within);
    let guard_b = timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(guard_b.fencing_token() > evicted.fence);
    assert!(matches!(
        a.try_acquire_for(&name, a.session_timeout()).await.unwrap(),
        Attempt::Held { .. }
    ));
    guard_b.release().await.unwrap();
}
