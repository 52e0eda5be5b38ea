//! Leases are sessions: what happens to a holder when its session expires,
//! when it is cut off, when the server crashes, and when the ensemble loses
//! its leader.

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::history::History;
use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::zk;
use lockcore::backend::LockBackendExt;
use lockcore::{
    Attempt, FencingToken, LeaseKind, LockBackend, LockError, LossReason, ReleaseOutcome,
};
use tokio::time::{Instant, timeout};

use crate::support::{
    children, connect, connect_with, kill_session, locker, raw, session_timeout, take, unique,
};

/// The holder's session is expired by the server while it holds the lock and
/// another client waits: the holder's `lost()` fires with the store's report
/// (long before its local deadline), the waiter gets the lock with a larger
/// fence, the old lease is refused, and the holder's backend goes on with a
/// fresh session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_session_fires_loss_and_hands_over() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let a = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    let b = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("expired-session");
    let ttl = a.session_timeout();

    let guard = locker(&a).acquire(&name).await.unwrap();
    let fence_a = guard.fencing_token();
    let old_session = a.client().unwrap().session_id();
    let waiter = tokio::spawn({
        let (locker, name) = (locker(&b), name.clone());
        async move { locker.acquire(&name).await }
    });
    let parent = a.lock_path(&name);
    eventually(ttl, "the waiter queueing", || async {
        (children(&observer, &parent).await.len() == 2).then_some(())
    })
    .await;

    // The servers delete the session's ephemerals, as when it expires.
    kill_session(&store, &proxy, &a, || async {
        children(&observer, &parent).await.len() == 1
    })
    .await;

    let reason = timeout(ttl, guard.lost())
        .await
        .expect("lost() fires on session expiry");
    assert_eq!(reason, LossReason::StoreReported);
    assert!(
        Instant::now() < guard.lease().deadline(),
        "the loss must come from the store, not from the local deadline"
    );
    assert!(!guard.is_held());

    let guard_b = timeout(ttl * 2, waiter)
        .await
        .expect("the waiter gets the lock after the holder's session expired")
        .unwrap()
        .unwrap();
    assert!(
        guard_b.fencing_token() > fence_a,
        "F1 across a session expiry"
    );
    let resource = lockcore::FencedResource::new(0_u32);
    resource
        .write(guard_b.fencing_token(), |v| *v += 1)
        .unwrap();
    assert!(
        resource.write(fence_a, |v| *v += 1).is_err(),
        "the old holder is fenced out"
    );

    let lease_a = guard.lease();
    assert!(matches!(
        a.renew(&lease_a).await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(a.release(&lease_a).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotHeld);

    let fence_b = guard_b.fencing_token();
    guard_b.release().await.unwrap();
    let again = a
        .try_acquire_for(&name, ttl)
        .await
        .unwrap()
        .into_lease()
        .expect("A locks again");
    assert!(again.fence() > fence_b);
    assert_ne!(
        a.client().unwrap().session_id(),
        old_session,
        "A opened a fresh session"
    );
    a.release(&again).await.unwrap();
}

/// A holder cut off from the server (no RST, nothing answers) counts its
/// lease lost at its own local deadline, while its client has not even
/// learned that the session expired; the waiter gets the lock only after
/// that deadline, once the server expired the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_holder_counts_the_lease_lost_by_its_own_clock() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let a = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    let b = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("cut-off");
    let ttl = a.session_timeout();
    let history = History::new();

    let invoked = Instant::now();
    let guard = locker(&a).acquire(&name).await.unwrap();
    let grant_a = history.granted(0, &name, guard.fencing_token(), invoked);
    let waiter = tokio::spawn({
        let (locker, name) = (locker(&b), name.clone());
        async move {
            let invoked = Instant::now();
            locker
                .acquire(&name)
                .await
                .map(|g| (g, invoked, Instant::now()))
        }
    });
    let parent = a.lock_path(&name);
    eventually(ttl, "the waiter queueing", || async {
        (children(&observer, &parent).await.len() == 2).then_some(())
    })
    .await;

    proxy.set(Mode::Blackhole);
    let reason = timeout(ttl * 2, guard.lost())
        .await
        .expect("lost() fires while cut off");
    let fired = Instant::now();
    let deadline = guard.lease().deadline();
    assert!(
        fired <= deadline + Duration::from_millis(250).mul_f64(crate::support::time_scale()),
        "lost() ({reason}) fired {:?} after the local deadline",
        fired - deadline
    );
    assert_ne!(
        a.client().unwrap().state(),
        zk::SessionState::Expired,
        "the client cannot have heard of the expiry yet: the loss came from its own clock"
    );
    history.end(grant_a, fired.min(deadline));

    let (guard_b, invoked_b, granted_b) = timeout(ttl * 3, waiter)
        .await
        .expect("the waiter gets the lock once the server expires the cut-off session")
        .unwrap()
        .unwrap();
    let grant_b = history.granted(1, &name, guard_b.fencing_token(), invoked_b);
    assert!(
        granted_b >= deadline,
        "granted before the old holder's deadline"
    );
    assert!(guard_b.fencing_token() > guard.fencing_token());

    proxy.set(Mode::Pass);
    assert!(!guard.is_held(), "healing never resurrects a lost lease");
    history.end(grant_b, Instant::now());
    guard_b.release().await.unwrap();
    let violations = history.check();
    assert!(violations.is_empty(), "{violations:?}");
}

/// A holder cut off one way (its requests reach the server, the replies do
/// not) gives its session up on its own 7/5 of the timeout after its last
/// reply, while the server, which still heard its reconnection attempts,
/// keeps the session and its lock node for up to one more timeout. Once the
/// network heals, the backend closes that session itself: the node goes at
/// once, not when the server would have expired it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_given_up_locally_is_closed_once_the_network_heals() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let ttl = session_timeout();
    // A short connection timeout: a reconnection whose reply was lost is
    // given up after a fifth of the session.
    let a = connect_with(&store.endpoint_via(proxy.addr()), |c| {
        c.connection_timeout(ttl / 5)
    })
    .await
    .unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("given-up");
    let _lease = take(&a, &name).await;
    let nodes = children(&observer, &a.lock_path(&name)).await;
    let node = format!("{}/{}", a.lock_path(&name), nodes[0]);
    let (_, deleted) = observer.check_and_watch_stat(&node).await.unwrap();
    let given_up = a.client().unwrap();

    proxy.set(Mode::DropDownstream);
    eventually(ttl * 2, "the client giving its session up", || async {
        given_up.state().is_terminated().then_some(())
    })
    .await;
    let local_end = Instant::now();
    assert_eq!(given_up.state(), zk::SessionState::Expired);
    assert!(
        observer.check_stat(&node).await.unwrap().is_some(),
        "the server still keeps the session the client gave up"
    );
    proxy.set(Mode::Pass);
    timeout(ttl * 2, deleted.changed())
        .await
        .expect("the node goes at last");
    let gone = Instant::now() - local_end;
    eprintln!("node deleted {gone:?} after the client gave its session up");
    // The server heard the client's last reconnection attempt at most a
    // connection timeout (plus the client's pause between attempts) before
    // the client gave up, and would keep the session until a timeout after
    // that: at least 3/5 of the timeout past the local end.
    assert!(
        gone < ttl / 2,
        "the node lived {gone:?} past the local end: the session was left to expire on the server"
    );
    assert!(
        !a.client().unwrap().state().is_terminated(),
        "the backend went on with a new session"
    );
}

/// `kill -9` of the server while a lock is held: the session survives the
/// restart (the server restores it from its log), so the holder keeps the
/// lock and keeps renewing it; fences keep growing across the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_lock_survives_a_server_crash_and_fences_keep_growing() {
    if !crate::support::may_launch_servers(
        "held_lock_survives_a_server_crash_and_fences_keep_growing",
    ) {
        return;
    }
    let store = Arc::new(zookeeper::start(zookeeper::Options::default()).unwrap());
    // Long enough to ride out a JVM restart on a busy machine: the client
    // must renew on the restarted server before its own session clock ends.
    let long = |c: lock_zookeeper::ZooKeeperConfig| c.session_timeout(Duration::from_secs(30));
    let a = connect_with(&store.endpoint(), long).await.unwrap();
    let b = connect_with(&store.endpoint(), long).await.unwrap();
    let name = unique("crash");
    let ttl = a.session_timeout();

    let mut last = None;
    for _ in 0..20 {
        let lease = take(&a, &name).await;
        assert!(last < Some(lease.fence()));
        last = Some(lease.fence());
        a.release(&lease).await.unwrap();
    }
    let guard = locker(&a).acquire(&name).await.unwrap();
    assert!(last < Some(guard.fencing_token()));

    let crashed = store.clone();
    tokio::task::spawn_blocking(move || {
        crashed.kill_now()?;
        crashed.restart_now()
    })
    .await
    .unwrap()
    .unwrap();
    let restarted = Instant::now();

    // Wait for a renewal sent after the restart: the session is alive again.
    eventually(ttl, "a renewal after the restart", || async {
        (guard.lease().issued().mono() > restarted).then_some(())
    })
    .await;
    assert!(guard.is_held(), "lost: {:?}", guard.loss_reason());
    let holder = b
        .inspect(&name)
        .await
        .unwrap()
        .expect("the lock is still held");
    assert_eq!(holder.fence, guard.fencing_token());
    assert!(matches!(
        b.try_acquire_for(&name, ttl).await.unwrap(),
        Attempt::Held { .. }
    ));

    let fence_a = guard.fencing_token();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let next = take(&b, &name).await;
    assert!(next.fence() > fence_a, "F2: fence after the crash");
    b.release(&next).await.unwrap();
}

/// A 3-server ensemble loses its leader (`kill -9`) while a lock is held and
/// contended. The holder's session moves to a surviving server: the holder
/// keeps the lock or reports its loss, never both silently; the waiter gets
/// the lock after it, with a larger fence; nobody holds it twice at once,
/// and fences keep growing under the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_loss_in_an_ensemble_keeps_exclusion_and_fences() {
    if !crate::support::may_launch_servers("leader_loss_in_an_ensemble_keeps_exclusion_and_fences")
    {
        return;
    }
    let cluster = tokio::task::spawn_blocking(|| zookeeper::start_ensemble(3))
        .await
        .unwrap()
        .unwrap();
    let connect_string = cluster.connect_string();
    let long = |c: lock_zookeeper::ZooKeeperConfig| c.session_timeout(Duration::from_secs(15));
    let a = connect_with(&connect_string, long).await.unwrap();
    let b = connect_with(&connect_string, long).await.unwrap();
    let name = unique("leader-loss");
    let history = Arc::new(History::new());

    let invoked = Instant::now();
    let guard = locker(&a).acquire(&name).await.unwrap();
    let fence_a = guard.fencing_token();
    let grant_a = history.granted(0, &name, fence_a, invoked);
    let waiter = tokio::spawn({
        let (locker, name, history) = (locker(&b), name.clone(), history.clone());
        async move {
            let invoked = Instant::now();
            let guard = locker
                .acquire_timeout(&name, Duration::from_secs(120))
                .await?;
            let at = history.granted(1, &name, guard.fencing_token(), invoked);
            Ok::<_, LockError>((guard, at))
        }
    });
    let observer = raw(&connect_string).await;
    let parent = a.lock_path(&name);
    eventually(Duration::from_secs(20), "the waiter queueing", || async {
        (children(&observer, &parent).await.len() == 2).then_some(())
    })
    .await;
    drop(observer);

    let leader = tokio::task::spawn_blocking(move || {
        let leader = cluster.kill_leader()?;
        cluster.wait_leader(Duration::from_secs(60))?;
        Ok::<_, std::io::Error>((cluster, leader))
    })
    .await
    .unwrap()
    .unwrap();
    let (cluster, killed) = leader;
    let elected = Instant::now();

    // Either the session survived the failover (the usual case: the session
    // timeout outlasts the election) and renewals resume, or the guard
    // reported the loss. Wait for one or the other.
    let kept = tokio::select! {
        _ = eventually(a.session_timeout(), "a renewal under the new leader", || async {
            (guard.lease().issued().mono() > elected).then_some(())
        }) => true,
        _ = guard.lost() => false,
    };
    if kept {
        assert!(guard.is_held());
        history.end(grant_a, Instant::now());
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    } else {
        history.end(grant_a, guard.lease().deadline());
    }
    let (guard_b, grant_b) = timeout(Duration::from_secs(60), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let fence_b = guard_b.fencing_token();
    assert!(fence_b > fence_a, "F1 across the failover");
    history.end(grant_b, Instant::now());
    guard_b.release().await.unwrap();

    // A fresh client under the new leader: fences (czxids of a new epoch) grow.
    let survivor = cluster
        .members
        .iter()
        .enumerate()
        .find(|(i, _)| *i != killed)
        .map(|(_, m)| m.endpoint())
        .unwrap();
    let c = connect_with(&survivor, long).await.unwrap();
    let lease = take(&c, &name).await;
    assert!(lease.fence() > fence_b);
    c.release(&lease).await.unwrap();
    let violations = history.check();
    assert!(violations.is_empty(), "{violations:?}");
    drop(cluster);
}

/// The session timeout the server grants is every lease's TTL, reported in
/// the lease and in `capabilities()`: asking below the server's minimum
/// (1 s here) or above its maximum (60 s) is clamped by the server, and the
/// backend says so truthfully. (Until the server answers, the client times
/// its connection attempts by the timeout asked for, so asking far below
/// what the network can answer in fails to connect.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiated_session_timeout_is_every_lease_ttl() {
    let store = zookeeper::shared();
    for (asked, granted) in [
        (Duration::from_millis(900), Duration::from_secs(1)),
        (session_timeout(), session_timeout()),
        (Duration::from_secs(600), Duration::from_secs(60)),
    ] {
        let backend = connect_with(&store.endpoint(), |c| c.session_timeout(asked))
            .await
            .unwrap();
        assert_eq!(backend.session_timeout(), granted, "asked {asked:?}");
        let caps = backend.capabilities();
        assert_eq!(caps.lease_kind, LeaseKind::Session { timeout: granted });
        let name = unique("negotiated");
        let sent = Instant::now();
        let lease = backend
            .try_acquire_for(&name, Duration::from_secs(30))
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert_eq!(lease.ttl().get(), granted);
        assert!(lease.deadline() <= sent + granted);
        backend.release(&lease).await.unwrap();
    }
}

/// With a 1 s session, a guard renews often enough to keep the lock for
/// several session timeouts while another client is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_sessions_hold_while_renewed() {
    let store = zookeeper::shared();
    let short = |c: lock_zookeeper::ZooKeeperConfig| c.session_timeout(Duration::from_secs(1));
    let a = connect_with(&store.endpoint(), short).await.unwrap();
    let b = connect(store.endpoint()).await.unwrap();
    let name = unique("short-session");
    let guard = locker(&a).acquire(&name).await.unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(matches!(
            b.try_acquire_for(&name, b.session_timeout()).await.unwrap(),
            Attempt::Held { .. }
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(guard.is_held(), "lost: {:?}", guard.loss_reason());
    guard.release().await.unwrap();
}

/// An attempt its session ends under is made once more on a new session:
/// granted, not failed. Here the end is a retirement: the fence floor is
/// raised and the connection broken while the attempt's create is
/// answered late, so the session finds the floor changed across a break
/// (as after a restore) in the middle of the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_its_session_ends_under_is_made_again_on_a_new_session() {
    let store = zookeeper::shared();
    // A root of its own: the floor raised here is this test's alone.
    let root = format!("/zk-tests-ended-under-{}", uuid::Uuid::new_v4().simple());
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = connect_with(&store.endpoint_via(proxy.addr()), |c| c.root(root.clone()))
        .await
        .unwrap();
    let operator = connect_with(&store.endpoint(), |c| c.root(root.clone()))
        .await
        .unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("ended-under");
    // The session's floor is known: the attempt goes out with no read first.
    let settled = take(&client, &unique("ended-under-settle")).await;
    client.release(&settled).await.unwrap();
    let old = crate::support::session_id(&client);
    let late = crate::support::round_trip(&client).await + scaled(Duration::from_millis(500));
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    let attempt = tokio::spawn({
        let (client, name) = (client.clone(), name.clone());
        async move {
            client
                .try_acquire_for(&name, client.session_timeout())
                .await
        }
    });
    let parent = client.lock_path(&name);
    eventually(
        scaled(Duration::from_secs(5)),
        "the attempt's node",
        || async { (!children(&observer, &parent).await.is_empty()).then_some(()) },
    )
    .await;
    let floor = FencingToken::new(settled.fence().get() + 1_000_000).unwrap();
    operator.raise_fence_floor(floor).await.unwrap();
    proxy.set(Mode::Reset);
    eventually(
        scaled(Duration::from_secs(5)),
        "the connection broken",
        || async {
            crate::support::connections(store.addr(), old)
                .is_empty()
                .then_some(())
        },
    )
    .await;
    assert!(
        !attempt.is_finished(),
        "the attempt ended before its session did"
    );
    proxy.set(Mode::Pass);
    let outcome = timeout(session_timeout() * 2, attempt)
        .await
        .expect("the attempt ends")
        .unwrap();
    let lease = match outcome {
        Ok(Attempt::Acquired(lease)) => lease,
        other => panic!("the attempt its session ended under was not made again: {other:?}"),
    };
    assert_ne!(
        crate::support::session_id(&client),
        old,
        "granted on the retired session"
    );
    assert!(lease.fence() > floor, "granted under the floor");
    client.release(&lease).await.unwrap();
}
