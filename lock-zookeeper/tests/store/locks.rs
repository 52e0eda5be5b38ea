//! The queue recipe on the wire: what nodes exist, and when they go away;
//! and the sequence proof: a session that released the only node of a queue
//! takes it again with a create alone, and never when anything else
//! happened to the queue in between (another node, a recreated parent, a
//! broken connection).

use std::time::Duration;

use futures_util::future::BoxFuture;
use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::Mode;
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, zk};
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{CancellationToken, Kind, LockBackendExt};
use lockcore::{Attempt, LockBackend, LockError, LockName, ReleaseOutcome};
use tokio::time::{Instant, timeout};
use uuid::Uuid;

use crate::support::{
    answered, behind_proxy, children, connect, delete_parent, lasting_parent, locker, raw,
    session_id, silent_drop, take, unique,
};

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
        // The parent exists already (and stays), so the create is the only
        // write in flight.
        lasting_parent(&observer, &parent).await;
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
        a.client().unwrap().state(),
        zk::SessionState::SyncConnected,
        "A's session lives on"
    );
}

/// An abandoned lease whose deletion at its deadline never reaches the
/// server (a proxy drops it and keeps the connection: the client library
/// waits for its reply as long as the connection lives) is deleted all the
/// same, by a later try: the name is free within a session timeout of the
/// deadline, not held for as long as the session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lease_whose_deletion_is_lost_is_deleted_again() {
    let (proxy, a, _) = behind_proxy().await;
    let b = connect(zookeeper::shared().endpoint()).await.unwrap();
    let name = unique("abandoned-lost-delete");
    let ttl = a.session_timeout();
    let lease = take(&a, &name).await;
    let deadline = lease.deadline();
    drop(lease);
    // Requests sent around the deadline are lost; the drop is shorter than
    // the client's ping timeout, so the connection lives on.
    tokio::time::sleep_until(deadline - Duration::from_millis(200)).await;
    proxy.set(Mode::DropUpstream);
    tokio::time::sleep_until(deadline + Duration::from_millis(600)).await;
    proxy.set(Mode::Pass);
    let bound = deadline + ttl + Duration::from_secs(2);
    let wait = WaitPolicy::new(bound);
    let next = b.acquire_for(&name, ttl, &wait).await.unwrap();
    let next = next.unwrap_or_else(|| {
        panic!(
            "the abandoned lease still held {:?} after its deadline",
            bound - deadline
        )
    });
    assert!(
        Instant::now() >= deadline,
        "granted before the abandoned lease's deadline"
    );
    b.release(&next).await.unwrap();
}

/// A waiter dropped while its node's removal never reaches the server (a
/// proxy drops it and keeps the connection, as for the abandoned lease
/// above) has its node removed all the same, by a later try: once the
/// holder releases, the name is free within a session timeout, not held by
/// the dropped waiter's node for as long as its session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_whose_removal_is_lost_is_removed_again() {
    let (proxy, a, observer) = behind_proxy().await;
    let b = connect(zookeeper::shared().endpoint()).await.unwrap();
    let name = unique("dropped-lost-removal");
    let parent = b.lock_path(&name);
    let ttl = a.session_timeout();
    let lease = take(&b, &name).await;
    let waiting = tokio::spawn({
        let (a, name) = (a.clone(), name.clone());
        async move { locker(&a).acquire(&name).await }
    });
    eventually(
        scaled(Duration::from_secs(2)),
        "A's waiter queueing",
        || async { (children(&observer, &parent).await.len() == 2).then_some(()) },
    )
    .await;
    // The waiter's removal is lost; the connection lives on.
    proxy.set(Mode::DropUpstream);
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    tokio::time::sleep(silent_drop(&a)).await;
    proxy.set(Mode::Pass);
    let healed = Instant::now();
    assert_eq!(b.release(&lease).await.unwrap(), ReleaseOutcome::Released);
    let bound = healed + ttl + scaled(Duration::from_secs(2));
    let next = b
        .acquire_for(&name, ttl, &WaitPolicy::new(bound))
        .await
        .unwrap();
    let next = next.unwrap_or_else(|| {
        panic!(
            "the dropped waiter's node still held the name {:?} after the link healed",
            bound - healed
        )
    });
    b.release(&next).await.unwrap();
    assert_eq!(
        a.client().unwrap().state(),
        zk::SessionState::SyncConnected,
        "A's session lived on: its node had to be removed by A"
    );
}

/// A call whose request is lost on a connection that lives on (a proxy
/// drops it) ends within the session timeout, answered or `Unavailable`,
/// instead of waiting for a reply as long as the session lives: each look
/// at holders, each watch and an eviction. Once the link heals, the same
/// session answers them again. (`raise_fence_floor`, which retires the
/// sessions of other tests sharing the server, has its own test on a
/// private server: `fencing::a_floor_raise_whose_request_is_lost_...`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_request_is_lost_ends_within_the_session_timeout() {
    let (proxy, a, _observer) = behind_proxy().await;
    let name = unique("lost-request");
    let session = session_id(&a);
    let limit = a.session_timeout() + scaled(Duration::from_secs(2));
    let kinds = [Kind::Lock, Kind::Semaphore, Kind::ReadWrite];
    let calls = |a: &ZooKeeperBackend| {
        let mut calls: Vec<(String, BoxFuture<'static, Result<(), LockError>>)> = Vec::new();
        for kind in kinds {
            let (a, name) = (a.clone(), name.clone());
            let looking = async move { a.holders(&name, kind).await.map(drop) };
            calls.push((format!("holders of a {kind:?}"), Box::pin(looking)));
        }
        for kind in kinds {
            let (a, name) = (a.clone(), name.clone());
            let watching = async move { a.watch(&name, kind).await.map(drop) };
            calls.push((format!("watch of a {kind:?}"), Box::pin(watching)));
        }
        let (a, name) = (a.clone(), name.clone());
        let evicting = async move { a.evict(&name, None).await.map(drop) };
        calls.push(("evict".to_owned(), Box::pin(evicting)));
        calls
    };
    proxy.set(Mode::DropUpstream);
    let lost: Vec<_> = calls(&a)
        .into_iter()
        .map(|(what, call)| (what, tokio::spawn(timeout(limit, call))))
        .collect();
    tokio::time::sleep(silent_drop(&a)).await;
    proxy.set(Mode::Pass);
    for (what, call) in lost {
        let ended = call.await.unwrap();
        let result = ended.unwrap_or_else(|_| panic!("the {what} still waited after {limit:?}"));
        if let Err(error) = result {
            assert!(error.is_retryable(), "the {what} failed for good: {error}");
        }
    }
    for (what, call) in calls(&a) {
        let answered = timeout(limit, call).await;
        let answered =
            answered.unwrap_or_else(|_| panic!("the {what} got no answer after healing"));
        answered.unwrap_or_else(|e| panic!("the {what} failed after healing: {e}"));
    }
    assert_eq!(
        session_id(&a),
        session,
        "the calls were lost on one session that lived on"
    );
}

async fn cycle(backend: &ZooKeeperBackend, name: &LockName) -> lockcore::FencingToken {
    let lease = backend
        .try_acquire_for(name, backend.session_timeout())
        .await
        .unwrap()
        .into_lease()
        .expect("the lock is free");
    let fence = lease.fence();
    assert_eq!(
        backend.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    fence
}

/// A queue node as another client (Curator, `zookeeper-client`, another
/// distlock process) would create it.
async fn queue_node(client: &zk::Client, parent: &str) -> String {
    let prefix = format!("{parent}/_c_{}-lock-", Uuid::new_v4().hyphenated());
    let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, sequence) = client.create(&prefix, &[], &mode).await.unwrap();
    format!("{prefix}{sequence}")
}

/// Once a session released the only node of a queue, taking the lock again
/// costs a create and a delete: no listing, no watch. The first cycle lists
/// (and sets the one watch on the parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycles_send_only_create_and_delete() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let name = unique("only-create-delete");
    let sid = session_id(&a);
    lasting_parent(&raw(&store.endpoint()).await, &a.lock_path(&name)).await;

    let before = answered(store.addr(), sid);
    let mut last = cycle(&a, &name).await;
    let cold = answered(store.addr(), sid) - before;
    assert!(
        cold >= 3,
        "the first cycle lists the queue ({cold} requests)"
    );

    const CYCLES: u64 = 40;
    let before = answered(store.addr(), sid);
    for _ in 0..CYCLES {
        let fence = cycle(&a, &name).await;
        assert!(fence > last);
        last = fence;
    }
    let requests = answered(store.addr(), sid) - before;
    // Exactly 2 per cycle; a cycle that ran longer than a twentieth of the
    // session timeout on a loaded machine may add the granted node's watch.
    assert!(
        (2 * CYCLES..2 * CYCLES + CYCLES / 4).contains(&requests),
        "{requests} requests for {CYCLES} cycles"
    );
}

/// Someone else queued between two of our cycles: our create gets a later
/// number than the one vouched for, so the queue is listed, and the lock is
/// held by the other node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_voids_the_proof() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let other = raw(&store.endpoint()).await;
    let name = unique("another-node");
    let parent = a.lock_path(&name);
    lasting_parent(&other, &parent).await;
    cycle(&a, &name).await;
    cycle(&a, &name).await;

    let holder = queue_node(&other, &parent).await;
    let attempt = a.try_acquire_for(&name, a.session_timeout()).await.unwrap();
    assert!(matches!(attempt, Attempt::Held { .. }), "{attempt:?}");
    let left = children(&other, &parent).await;
    assert_eq!(left.len(), 1, "our node was removed: {left:?}");
    assert!(holder.ends_with(&left[0]));

    other.delete(&holder, None).await.unwrap();
    cycle(&a, &name).await;
}

/// The parent was deleted (as the container reaper does once it is empty)
/// and created again, and a node queued in it: our create gets exactly the
/// number vouched for, but in another parent, behind that node. The watch on
/// the old parent fired, so the queue is listed and the lock is not granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_parent_voids_the_proof() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let other = raw(&store.endpoint()).await;
    let name = unique("recreated-parent");
    let parent = a.lock_path(&name);
    cycle(&a, &name).await; // sequence 0; the next create would get 1

    delete_parent(&other, &parent).await;
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    other.create(&parent, &[], &container).await.unwrap();
    let holder = queue_node(&other, &parent).await;
    assert!(holder.ends_with("-lock-0000000000"));

    let attempt = a.try_acquire_for(&name, a.session_timeout()).await.unwrap();
    assert!(matches!(attempt, Attempt::Held { .. }), "{attempt:?}");
    // The parent's `cversion` counts child creations and deletions: the
    // holder's create (sequence 0), ours (sequence 1, the number vouched
    // for), and the removal of ours.
    let (_, stat) = other.get_children(&parent).await.unwrap();
    assert_eq!(stat.cversion, 3, "our create got sequence 1");

    other.delete(&holder, None).await.unwrap();
    cycle(&a, &name).await;
}

/// The connection broke and healed between two cycles, and meanwhile the
/// parent was recreated with a node in it: the proof is not used across a
/// reconnection, and the lock is not granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnection_voids_the_proof() {
    let (proxy, a, other) = behind_proxy().await;
    let name = unique("reconnected");
    let parent = a.lock_path(&name);
    cycle(&a, &name).await;

    let mut states = a.client().unwrap().state_watcher();
    proxy.reset_existing();
    timeout(Duration::from_secs(5), async {
        while states.changed().await != zk::SessionState::Disconnected {}
    })
    .await
    .expect("the client notices the reset");
    delete_parent(&other, &parent).await;
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    other.create(&parent, &[], &container).await.unwrap();
    let holder = queue_node(&other, &parent).await;

    let attempt = a.try_acquire_for(&name, a.session_timeout()).await.unwrap();
    assert!(matches!(attempt, Attempt::Held { .. }), "{attempt:?}");
    other.delete(&holder, None).await.unwrap();
    cycle(&a, &name).await;
}

/// A grant held past a twentieth of the session timeout gets a watch on its
/// node (one request, sent by the session's keeper), which turns a deletion
/// by someone else into the lease's loss signal, with no renewal involved.
/// A grant released sooner never costs that request (see above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_hold_is_watched_and_learns_of_its_eviction() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let other = raw(&store.endpoint()).await;
    let name = unique("kept");
    let parent = a.lock_path(&name);
    let sid = session_id(&a);
    let lease = take(&a, &name).await;
    let granted = answered(store.addr(), sid);
    eventually(
        a.session_timeout() / 2,
        "the keeper watching the node",
        || async { (answered(store.addr(), sid) > granted).then_some(()) },
    )
    .await;
    let node = children(&other, &parent).await.pop().unwrap();
    other
        .delete(&format!("{parent}/{node}"), None)
        .await
        .unwrap();
    timeout(
        Duration::from_secs(2),
        lease.loss_signal().unwrap().cancelled(),
    )
    .await
    .expect("the node watch fires the loss signal");
    assert_eq!(a.release(&lease).await.unwrap(), ReleaseOutcome::NotHeld);
    cycle(&a, &name).await;
}

/// Attempts of one session racing for a lock it just released alone: one
/// create gets the vouched number (the proof is taken once), the others get
/// later numbers, list the queue, and find it held. Never two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_attempts_of_one_session_never_share_the_lock() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let name = unique("racing");
    for _ in 0..25 {
        cycle(&a, &name).await; // alone: vouches for the next number
        let attempts: Vec<_> = (0..3)
            .map(|_| {
                let (a, name) = (a.clone(), name.clone());
                tokio::spawn(async move { a.try_acquire_for(&name, a.session_timeout()).await })
            })
            .collect();
        let mut leases = Vec::new();
        for attempt in attempts {
            if let Attempt::Acquired(lease) = attempt.await.unwrap().unwrap() {
                leases.push(lease);
            }
        }
        assert_eq!(leases.len(), 1, "exactly one of the racing attempts holds");
        a.release(&leases[0]).await.unwrap();
    }
}

/// Renewing a lease whose node the client already watches costs one
/// request, the session's `sync`: the watch, set before it and not fired
/// by its answer, proves the node is still there (no read of the node).
///
/// A renewal that runs while many of its locks are being released reads
/// the nodes whose watch went (their release fired it) together, in one
/// round trip. Read one after another, a round trip each, such a renewal
/// outlasted the leases it renewed: the bench's 10,000 held locks, released
/// 64 at a time, lost up to a quarter of the rest as `RenewalUnanswered`.
/// Here every round trip is slowed to 100 ms, so 200 reads in series take
/// 20 s, and the renewal must end within the session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_during_many_releases_reads_their_nodes_together() {
    const RELEASED: usize = 200;
    let store = zookeeper::shared();
    let (proxy, a, _raw) = behind_proxy().await;
    let names: Vec<_> = (0..=RELEASED)
        .map(|_| unique("renew-during-releases"))
        .collect();
    let leases = futures_util::future::join_all(names.iter().map(|name| take(&a, name))).await;
    // Each holder's keeper watches its node within the eviction notice;
    // then a renewal refreshes every lease (these leases have no renewer).
    let sid = session_id(&a);
    let nodes: Vec<_> = (names.iter())
        .map(|name| format!("{}/", a.lock_path(name)))
        .collect();
    let notice = a.capabilities().eviction_notice.unwrap();
    let within = notice * 4 + scaled(Duration::from_secs(1));
    eventually(within, "every node watched", || async {
        let watched = crate::support::watches(store.addr(), sid);
        let all = (nodes.iter()).all(|node| watched.iter().any(|p| p.starts_with(node.as_str())));
        all.then_some(())
    })
    .await;
    let mut leases: Vec<_> = (a.renew_many(&leases).await.into_iter())
        .map(|renewed| renewed.expect("every lock held"))
        .collect();
    let held_on = leases.pop().expect("one lock stays held");
    let mut batch = leases.clone();
    batch.push(held_on.clone());

    let one_way = Duration::from_millis(50);
    proxy.set(Mode::Delay {
        base: one_way,
        jitter: Duration::ZERO,
    });
    let started = Instant::now();
    // The deletes go out first (join polls in order), then the renewal,
    // whose batch still has every lock (no delete was answered yet): the
    // server fires the watches before it answers the renewal's sync.
    let releases = futures_util::future::join_all(leases.iter().map(|l| a.release(l)));
    let (released, renewed) = futures_util::future::join(releases, a.renew_many(&batch)).await;
    let took = started.elapsed();
    proxy.set(Mode::Pass);

    for outcome in released {
        assert_eq!(outcome.unwrap(), ReleaseOutcome::Released);
    }
    let renewed = renewed.last().expect("the held lock's verdict").clone();
    let renewed = renewed.unwrap_or_else(|e| panic!("the lock still held was not renewed: {e}"));
    let limit = a.session_timeout();
    assert!(
        took < limit,
        "renewing while {RELEASED} locks were released took {took:?} (round trips of {:?}), \
         not within the session timeout {limit:?}",
        one_way * 2
    );
    assert_eq!(a.release(&renewed).await.unwrap(), ReleaseOutcome::Released);
}

/// The server shows the watch once it has the `exists` that sets it; the
/// client takes the watch when its keeper handles the reply, which a loaded
/// machine can schedule after a renew has left (that renew reads the node
/// too, two requests). So renews are tried until the client watches, within
/// the declared eviction notice; a renew that always reads fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_a_watched_lease_costs_one_request() {
    let store = zookeeper::shared();
    let holder = connect(store.endpoint()).await.unwrap();
    let name = unique("renew-watched");
    let lease = take(&holder, &name).await;
    let sid = session_id(&holder);
    crate::support::until_node_watched(&store, &holder, &name).await;
    let notice = holder.capabilities().eviction_notice.unwrap();
    let within = notice * 4 + lock_conformance::kit::scaled(Duration::from_secs(1));
    let renewed = eventually(
        within,
        "a renew of the watched lease in one request",
        || async {
            let before = answered(store.addr(), sid);
            let renewed = holder.renew(&lease).await.unwrap();
            let requests = answered(store.addr(), sid) - before;
            assert!(requests <= 2, "{requests} requests to renew one lease");
            (requests == 1).then_some(renewed)
        },
    )
    .await;
    holder.release(&renewed).await.unwrap();
}
