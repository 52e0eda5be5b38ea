//! The session's shared view of a queue: waiters of several sessions are
//! served in arrival order, a waiter ahead that gives up lets the next one
//! through at once, nodes that left unseen cost one listing, and a
//! reconnection loses nobody's turn.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::poll::{TimedOut, try_eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, zk};
use lockcore::{FencingToken, LockError, LockGuard, LockName};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::{
    answered, children, connect, lasting_parent, locker, raw, round_trip, session_id, silent_drop,
    unique, until_node_watched, watches,
};

/// Three sessions of the shared server (the first one holds), a raw client
/// to look at the queue, and a fresh lock name with its parent path.
async fn three_sessions(what: &str) -> ([ZooKeeperBackend; 3], zk::Client, LockName, String) {
    let store = zookeeper::shared();
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(connect(store.endpoint()).await.unwrap());
    }
    let sessions: [ZooKeeperBackend; 3] = sessions.try_into().unwrap();
    let name = unique(what);
    let parent = sessions[0].lock_path(&name);
    (sessions, raw(&store.endpoint()).await, name, parent)
}

/// Eight waiters, alternately of two sessions, queue one after the other
/// behind a third session's holder: each is granted in turn, in the order
/// they queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_two_sessions_are_served_in_arrival_order() {
    let ([holder, a, b], observer, name, parent) = three_sessions("two-sessions").await;
    let held = locker(&holder).acquire(&name).await.unwrap();
    let served: Arc<Mutex<Vec<(usize, FencingToken)>>> = Arc::default();
    let mut waiters = Vec::new();
    for i in 0..8 {
        let locker = locker(if i % 2 == 0 { &a } else { &b });
        let (name, served) = (name.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locker
                .acquire_timeout(&name, Duration::from_secs(60))
                .await?;
            served.lock().unwrap().push((i, guard.fencing_token()));
            guard.release().await?;
            Ok::<_, LockError>(())
        }));
        // The next one queues after this one.
        until(Duration::from_secs(10), "the waiter in line", || async {
            children(&observer, &parent).await.len() == i + 2
        })
        .await;
    }
    held.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    let served = served.lock().unwrap().clone();
    let order: Vec<usize> = served.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        order,
        (0..8).collect::<Vec<_>>(),
        "served out of arrival order"
    );
    assert!(served.windows(2).all(|w| w[0].1 < w[1].1));
}

/// A waiter of another session ahead of ours gives up: once the holder
/// releases, ours is granted within a round trip, not at a re-check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_ahead_that_gives_up_lets_the_next_through() {
    let ([holder, ahead, ours], observer, name, parent) = three_sessions("gives-up").await;
    let held = locker(&holder).acquire(&name).await.unwrap();
    let giving_up = tokio::spawn({
        let (locker, name) = (locker(&ahead), name.clone());
        async move { locker.acquire_timeout(&name, Duration::from_secs(60)).await }
    });
    until(
        Duration::from_secs(10),
        "the first waiter in line",
        || async { children(&observer, &parent).await.len() == 2 },
    )
    .await;
    // Re-checks far apart: only the view's wake-up can be prompt.
    let patient = locker(&ours).recheck(Duration::from_secs(60));
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let guard = patient
                .acquire_timeout(&name, Duration::from_secs(60))
                .await;
            (guard, Instant::now())
        }
    });
    until(
        Duration::from_secs(10),
        "the second waiter in line",
        || async { children(&observer, &parent).await.len() == 3 },
    )
    .await;
    giving_up.abort();
    until(Duration::from_secs(10), "the first waiter gone", || async {
        children(&observer, &parent).await.len() == 2
    })
    .await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (guard, granted) = waiting.await.unwrap();
    let lag = granted - released;
    let bound = round_trip(&ours).await * 2;
    assert!(
        lag <= bound,
        "granted {lag:?} after the release (bound {bound:?})"
    );
    guard.unwrap().release().await.unwrap();
}

/// A waiter watches only the node just ahead of it, so the nodes ahead of
/// that one can leave unseen. When the watched one goes too, the waiter
/// lists the queue once (a `sync` and a listing), rather than asking after
/// each node it had seen, one request each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_left_unseen_cost_one_listing_not_one_request_each() {
    const AHEAD: usize = 20;
    let ([holder, others, ours], observer, name, parent) = three_sessions("left-unseen").await;
    let held = locker(&holder).acquire(&name).await.unwrap();
    let mut ahead = Vec::new();
    for queued in 1..=AHEAD {
        ahead.push(tokio::spawn({
            let (locker, name) = (locker(&others), name.clone());
            async move { locker.acquire_timeout(&name, Duration::from_secs(60)).await }
        }));
        until(
            Duration::from_secs(10),
            "a waiter ahead in line",
            || async { children(&observer, &parent).await.len() == 1 + queued },
        )
        .await;
    }
    let store = zookeeper::shared();
    let sid = session_id(&ours);
    let patient = locker(&ours).recheck(Duration::from_secs(60));
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            patient
                .acquire_timeout(&name, Duration::from_secs(60))
                .await
        }
    });
    let node_ahead = format!("{parent}/");
    until(
        Duration::from_secs(10),
        "our waiter watching the node ahead",
        || async { (watches(store.addr(), sid).iter()).any(|w| w.starts_with(&node_ahead)) },
    )
    .await;
    let last = ahead.pop().unwrap();
    for waiter in &ahead {
        waiter.abort();
    }
    until(
        Duration::from_secs(10),
        "the unwatched waiters gone",
        || async { children(&observer, &parent).await.len() == 3 },
    )
    .await;
    let before = answered(store.addr(), sid);
    last.abort();
    until(
        Duration::from_secs(10),
        "the watched waiter gone",
        || async { children(&observer, &parent).await.len() == 2 },
    )
    .await;
    held.release().await.unwrap();
    let guard = waiting.await.unwrap().unwrap();
    let requests = answered(store.addr(), sid) - before;
    // A listing (2), a watch on the holder's node (1), and at most one
    // look at our own node behind a `sync` (2) before the grant.
    assert!(
        requests <= 5,
        "{requests} requests from the watched node's departure to the grant, with {} nodes gone unseen",
        AHEAD - 1
    );
    guard.release().await.unwrap();
}

/// A waiter also watches the node ahead of the one just ahead of it. When
/// that one goes (the one just ahead is about to hold), it lists the queue
/// then, while the one just ahead still holds: the release of the one just
/// ahead then grants it with no request in between (before: a `sync` and a
/// listing, 2 requests, between the release and the grant, as nodes had
/// left unseen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_sends_no_request_between_the_release_and_the_grant() {
    let ([holder, second, third], observer, name, parent) = three_sessions("no-listing").await;
    let store = zookeeper::shared();
    let ours = connect(store.endpoint()).await.unwrap();
    let held = locker(&holder).acquire(&name).await.unwrap();
    // Two waiters ahead of ours, each of a session of its own.
    let mut ahead = Vec::new();
    for (queued, backend) in [&second, &third].into_iter().enumerate() {
        let (locker, name) = (locker(backend), name.clone());
        ahead.push(tokio::spawn(async move {
            locker.acquire_timeout(&name, Duration::from_secs(60)).await
        }));
        until(
            scaled(Duration::from_secs(10)),
            "a waiter in line",
            || async { children(&observer, &parent).await.len() == 2 + queued },
        )
        .await;
    }
    let sid = session_id(&ours);
    let patient = locker(&ours).recheck(Duration::from_secs(60));
    let waiting = tokio::spawn({
        let (name, addr) = (name.clone(), store.addr());
        async move {
            let guard = patient
                .acquire_timeout(&name, Duration::from_secs(60))
                .await;
            (guard, answered(addr, sid))
        }
    });
    let queue = children(&observer, &parent).await;
    let mut queue = queue
        .iter()
        .map(|n| format!("{parent}/{n}"))
        .collect::<Vec<_>>();
    queue.sort_by_key(|path| path[path.len() - 10..].to_owned());
    until(
        scaled(Duration::from_secs(10)),
        "our waiter watching the node ahead",
        || async { watches(store.addr(), sid).contains(&queue[2]) },
    )
    .await;
    // Watching the one beyond it too (the old code did not: it goes on).
    // Awaited for a while only: the old code never gets there, and then
    // fails at the count below, not here.
    let _ = try_eventually(scaled(Duration::from_secs(5)), "the far watch", || async {
        Ok::<_, TimedOut>(watches(store.addr(), sid).contains(&queue[1]).then_some(()))
    })
    .await;
    let before = answered(store.addr(), sid);
    held.release().await.unwrap();
    let first = ahead.remove(0).await.unwrap().unwrap();
    first.release().await.unwrap();
    let next = ahead.remove(0).await.unwrap().unwrap();
    // Its listing while `next` holds: a `sync` and the listing (the old
    // code sent none here, and the bound runs out).
    let _ = try_eventually(scaled(Duration::from_secs(5)), "the listing", || async {
        Ok::<_, TimedOut>((answered(store.addr(), sid) >= before + 2).then_some(()))
    })
    .await;
    let released = answered(store.addr(), sid);
    next.release().await.unwrap();
    let (guard, granted) = waiting.await.unwrap();
    assert_eq!(
        granted - released,
        0,
        "requests between the release of the node just ahead and the grant"
    );
    guard.unwrap().release().await.unwrap();
}

/// A waiter alone of its session on a name joins the view with the listing
/// sent with its create: its create, that listing and the watch on the
/// holder's node, 3 requests, before it waits (before: a `sync` and a
/// second listing too, 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_joins_on_the_listing_sent_with_its_create() {
    let ([holder, ours, _], observer, name, parent) = three_sessions("joins-listed").await;
    let store = zookeeper::shared();
    // A parent that is not a container: the server would delete an empty
    // one between our first grant and the holder's (every 200 ms here),
    // and our next create would cost a request to watch the new parent (4
    // requests, once in CI).
    lasting_parent(&observer, &parent).await;
    // The session's first grant reads the fence floor; this one is done.
    locker(&ours)
        .acquire(&name)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = locker(&holder).acquire(&name).await.unwrap();
    // The holder's node, the only one yet.
    let head = format!("{parent}/{}", children(&observer, &parent).await[0]);
    let sid = session_id(&ours);
    let before = answered(store.addr(), sid);
    let patient = locker(&ours).recheck(Duration::from_secs(60));
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            patient
                .acquire_timeout(&name, Duration::from_secs(60))
                .await
        }
    });
    until(
        scaled(Duration::from_secs(10)),
        "our waiter watching the holder",
        || async { watches(store.addr(), sid).contains(&head) },
    )
    .await;
    let requests = answered(store.addr(), sid) - before;
    assert!(requests <= 3, "{requests} requests to join the line");
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
}

/// A holder of a fresh lock name on the shared server, and a patient waiter
/// queued behind it through a fault proxy of its own (re-checking every
/// minute: only the view tells it in time), with a raw client to look.
struct WaiterBehindProxy {
    link: FaultProxy,
    waiter: ZooKeeperBackend,
    observer: zk::Client,
    name: LockName,
    parent: String,
    held: LockGuard,
    waiting: JoinHandle<Result<LockGuard, LockError>>,
}

/// [`WaiterBehindProxy`], once the waiter's node is in line.
async fn waiter_behind_proxy(what: &str) -> WaiterBehindProxy {
    let store = zookeeper::shared();
    let link = FaultProxy::start(store.addr()).await.unwrap();
    let holder = connect(store.endpoint()).await.unwrap();
    let waiter = connect(store.endpoint_via(link.addr())).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique(what);
    let parent = holder.lock_path(&name);
    let held = locker(&holder).acquire(&name).await.unwrap();
    let waiting = wait_patiently(&waiter, &name);
    until(
        scaled(Duration::from_secs(10)),
        "the waiter in line",
        || async { children(&observer, &parent).await.len() == 2 },
    )
    .await;
    WaiterBehindProxy {
        link,
        waiter,
        observer,
        name,
        parent,
        held,
        waiting,
    }
}

/// `waiter`'s `acquire` of `name` in a task, with a deadline and re-check
/// of a minute (scaled): only its wake-ups tell it in time.
fn wait_patiently(
    waiter: &ZooKeeperBackend,
    name: &LockName,
) -> JoinHandle<Result<LockGuard, LockError>> {
    let minute = scaled(Duration::from_secs(60));
    let patient = locker(waiter).recheck(minute);
    let name = name.clone();
    tokio::spawn(async move { patient.acquire_timeout(&name, minute).await })
}

/// The guard of `waiting`, a wait of `waiter` that lost a request (cut at
/// the session timeout) before or at the holder's release, just made: it
/// must be granted within a session timeout and a margin of the release.
async fn granted_past_a_lost_request(
    waiter: &ZooKeeperBackend,
    waiting: JoinHandle<Result<LockGuard, LockError>>,
) -> LockGuard {
    let within = waiter.session_timeout() + scaled(Duration::from_secs(2));
    tokio::time::timeout(within, waiting)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not granted within {within:?} of the release"))
        .unwrap()
        .unwrap()
}

/// The queue under `parent` holds one node, one of `queued` (listed once
/// the waiter was in line): the waiter was granted the place it kept, no
/// new node was created.
async fn granted_on_a_node_of(observer: &zk::Client, parent: &str, queued: &[String]) {
    let now = children(observer, parent).await;
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(
        queued.contains(&now[0]),
        "{now:?} was not in line before: {queued:?}"
    );
}

/// A waiter whose connection is reset while it waits keeps its place and
/// is granted when the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnection_loses_no_turn() {
    let w = waiter_behind_proxy("reconnected").await;
    let queued = children(&w.observer, &w.parent).await;
    w.link.reset_existing();
    w.held.release().await.unwrap();
    let guard = tokio::time::timeout(w.waiter.session_timeout(), w.waiting)
        .await
        .expect("granted within the session timeout")
        .unwrap()
        .unwrap();
    // Still the node it queued before the reset: no new one was created.
    granted_on_a_node_of(&w.observer, &w.parent, &queued).await;
    guard.release().await.unwrap();
}

/// A waiter whose view loses a request (the watch on the node ahead, set
/// again after a write to that node, sent while a proxy drops the waiter's
/// requests and keeps its connection) is still told it is first once the
/// holder releases: the view's requests are cut at the session timeout and
/// sent again, not waited for as long as the session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_view_loses_a_request_is_still_woken() {
    let w = waiter_behind_proxy("view-request-lost").await;
    until_node_watched(&zookeeper::shared(), &w.waiter, &w.name).await;
    // Sequence numbers are zero-padded: the first name is the holder's.
    let children = children(&w.observer, &w.parent).await;
    let ahead = children.into_iter().min().unwrap();
    // The write fires the view's watch, and the view's new watch is lost;
    // the connection lives on.
    w.link.set(Mode::DropUpstream);
    w.observer
        .set_data(&format!("{}/{ahead}", w.parent), b"scribble", None)
        .await
        .unwrap();
    tokio::time::sleep(silent_drop(&w.waiter)).await;
    w.link.set(Mode::Pass);
    w.held.release().await.unwrap();
    let guard = granted_past_a_lost_request(&w.waiter, w.waiting).await;
    guard.release().await.unwrap();
}

/// A waiter whose create is lost (sent while a proxy drops its requests and
/// keeps its connection) queues again once the try is cut at the session
/// timeout, and is granted after the holder releases: it does not wait for
/// the lost reply until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_create_is_lost_queues_again() {
    let store = zookeeper::shared();
    let link = FaultProxy::start(store.addr()).await.unwrap();
    let holder = connect(store.endpoint()).await.unwrap();
    let waiter = connect(store.endpoint_via(link.addr())).await.unwrap();
    let name = unique("create-lost");
    let held = locker(&holder).acquire(&name).await.unwrap();
    link.set(Mode::DropUpstream);
    let waiting = wait_patiently(&waiter, &name);
    tokio::time::sleep(silent_drop(&waiter)).await;
    link.set(Mode::Pass);
    held.release().await.unwrap();
    let guard = granted_past_a_lost_request(&waiter, waiting).await;
    guard.release().await.unwrap();
}

/// A waiter first in line whose proof of life is lost (the `sync` it sends
/// when the holder's release wakes it, its create being older than a
/// lease may start from, sent while a proxy drops its requests) keeps its
/// place, proves it again once the try is cut at the session timeout, and
/// is granted: it does not wait for the lost reply until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_waiter_whose_proof_is_lost_proves_it_again() {
    let w = waiter_behind_proxy("proof-lost").await;
    let queued = children(&w.observer, &w.parent).await;
    // Older than a quarter of the session: the grant needs a new proof.
    tokio::time::sleep(w.waiter.session_timeout() / 3).await;
    w.link.set(Mode::DropUpstream);
    w.held.release().await.unwrap();
    tokio::time::sleep(silent_drop(&w.waiter)).await;
    w.link.set(Mode::Pass);
    let guard = granted_past_a_lost_request(&w.waiter, w.waiting).await;
    // Granted on the node it queued: its place was kept.
    granted_on_a_node_of(&w.observer, &w.parent, &queued).await;
    guard.release().await.unwrap();
}
