//! Locks share one session lease per client and TTL: what that must not
//! change. A lock nobody renews still expires on its own TTL while the
//! client renews others on the same session; the end of a session reaches
//! every guard on it at once. And the faults the conformance suite cannot
//! aim this precisely: a write whose reply is lost retires its session (a
//! phantom entry must not outlive its TTL, however busy the client keeps its
//! other leases), a wait dropped with its entry in flight leaves nobody in
//! line, and a late keep-alive reply extends nothing. And the
//! batches that meet etcd's limit of operations per transaction.

use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::{self, etcd};
use lock_etcd::testing::{key_of, sessions};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{CancellationToken, LockBackendExt};
use lockcore::{Attempt, Lease, LockBackend, LockError, LockName, Locker, LossReason};
use tokio::time::Instant;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lock_expires_on_its_own_ttl_while_its_session_lives_on() {
    let url = etcd::shared().endpoint();
    let (client, observer) = (connect(&url).await, connect(&url).await);
    let ttl = Duration::from_secs(1);
    // One lock the client keeps renewing (refreshing the shared session)...
    let locker = Locker::new(client.clone()).ttl(ttl);
    let renewed = locker.acquire(name("renewed")).await.unwrap();
    // ...and one on the same session that nobody renews.
    let abandoned_name = name("abandoned");
    let abandoned = acquire(&client, &abandoned_name, ttl).await;
    assert_eq!(sessions(&client), 1, "both locks on one session");
    let caps = client.capabilities();
    let within = ttl + caps.slack_for(ttl) + scaled(Duration::from_millis(500));
    let wait = WaitPolicy::new(abandoned.issued().mono() + within)
        .recheck(scaled(Duration::from_millis(100)));
    let next = observer
        .acquire_for(&abandoned_name, ttl, &wait)
        .await
        .unwrap()
        .unwrap_or_else(|| {
            panic!("L1: a lock nobody renews was not free within TTL + slack ({within:?})")
        });
    let freed = Instant::now();
    assert!(
        freed >= abandoned.deadline(),
        "S3: freed {:?} before its holder's local deadline",
        abandoned.deadline() - freed
    );
    assert!(next.fence() > abandoned.fence());
    eprintln!(
        "unrenewed lock free {:?} after it was granted (TTL {ttl:?})",
        freed - abandoned.issued().mono()
    );
    // The renewed lock lived on throughout.
    tokio::time::sleep(ttl).await;
    assert!(
        renewed.is_held(),
        "the renewed lock on the same session was lost"
    );
    assert!(matches!(
        client.renew(&abandoned).await,
        Err(lockcore::LockError::NotHeld { .. })
    ));
    renewed.release().await.unwrap();
    observer.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_session_reaches_every_guard_on_it_at_once() {
    let url = etcd::shared().endpoint();
    let client = connect(&url).await;
    let mut raw = raw(&url).await;
    // Renewals every 4 s: only the store-pushed signal can be fast.
    let locker = Locker::new(client.clone())
        .ttl(Duration::from_secs(12))
        .renew_every(Duration::from_secs(4));
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(
            locker
                .acquire(name(&format!("session-end-{i}")))
                .await
                .unwrap(),
        );
    }
    let key = key_of(&guards[0].lease()).unwrap();
    let session = etcd_lease_of(&mut raw, &key).await;
    for guard in &guards[1..] {
        let key = key_of(&guard.lease()).unwrap();
        assert_eq!(etcd_lease_of(&mut raw, &key).await, session, "one session");
    }
    let revoked = Instant::now();
    raw.lease_revoke(session).await.unwrap();
    for guard in &guards {
        let reason = tokio::time::timeout(scaled(Duration::from_secs(2)), guard.lost())
            .await
            .expect("lost() must fire well before the next renewal (4 s)");
        assert_eq!(reason, LossReason::StoreReported);
        assert!(!guard.is_held());
    }
    eprintln!("3 guards lost {:?} after the revoke", revoked.elapsed());
    // The next lock gets a new session.
    let next = locker.acquire(name("after-session-end")).await.unwrap();
    let key = key_of(&next.lease()).unwrap();
    assert_ne!(etcd_lease_of(&mut raw, &key).await, session);
    next.release().await.unwrap();
}

/// The keeper drops a session nothing is attached to after a few idle
/// seconds, revoking its lease. A lock being written to it at that moment
/// must keep it alive: here the put is on its way (a slow link) when the
/// session turns idle, and lands before the revoke would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_not_dropped_while_a_lock_is_on_its_way_to_it() {
    use lock_conformance::kit::proxy::{FaultProxy, Mode};
    let store = etcd::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = connect(&store.endpoint_via(proxy.addr())).await;
    let observer = connect(&store.endpoint()).await;
    let ttl = Duration::from_secs(30);
    let lock = name("on-its-way");
    let first = acquire(&client, &lock, ttl).await;
    client.release(&first).await.unwrap();
    let released = Instant::now();
    // Idle from now; the keeper drops the session 5 s later. The next put
    // leaves before that and lands after it.
    proxy.set(Mode::Delay {
        base: Duration::from_secs(1),
        jitter: Duration::ZERO,
    });
    tokio::time::sleep_until(released + Duration::from_millis(4_500)).await;
    let held = acquire(&client, &lock, ttl).await;
    proxy.set(Mode::Pass);
    // Whatever the keeper did meanwhile, the lock is the client's.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = observer.inspect(&lock).await.unwrap();
    assert_eq!(
        seen.map(|h| h.fence),
        Some(held.fence()),
        "S1: the lock the client holds is gone from etcd"
    );
    assert!(matches!(
        observer.try_acquire_for(&lock, ttl).await.unwrap(),
        lockcore::Attempt::Held { .. }
    ));
    client.renew(&held).await.expect("still held");
    client.release(&held).await.unwrap();
}

/// Long next to the request timeout, as in production: a lease that gave
/// up on a request is still young enough to be pooled again.
/// Acquires that give up on the slow proxy: in about half of them the
/// cleanup lands before the put.
const ROUNDS: usize = 8;

const TTL: Duration = Duration::from_secs(4);

/// A proxy in front of `store`, and a client through it that gives up on a
/// request after `timeout`.
async fn behind_proxy(store: &stores::Store, timeout: Duration) -> (FaultProxy, EtcdBackend) {
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let client = EtcdBackend::connect_with(
        EtcdConfig::new([store.endpoint_via(proxy.addr())]).request_timeout(timeout),
    )
    .await
    .unwrap();
    (proxy, client)
}

/// A name no other test uses, numbered.
fn numbered(test: &str, i: usize) -> LockName {
    LockName::new(format!("{}/{i}", name(test))).unwrap()
}

/// etcd-client spreads requests over its endpoints at random. With two
/// proxies in front of one etcd, one slow (requests *and* replies late by
/// more than the request timeout) and one fast, an acquire sent through the
/// slow one times out, and whatever the client then does about it goes
/// through the fast one half of the time and lands first: the acquire's put
/// lands after it. The name must still be free within TTL + slack of that
/// put, even while the client keeps its leases busy. (Before leases of
/// such puts were revoked instead of pooled, the name stayed blocked for
/// as long as the client kept reusing the lease: over a minute here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_landing_after_the_client_gave_up_blocks_nobody_past_the_ttl() {
    let store = etcd::shared();
    let (slow, fast) = (
        FaultProxy::start(store.addr()).await.unwrap(),
        FaultProxy::start(store.addr()).await.unwrap(),
    );
    let timeout = scaled(Duration::from_millis(500));
    // Late by more than the request timeout, yet HTTP/2 pings (3 s
    // timeout) come back in time, so the connection stays up (up to scale 2).
    let late = timeout + Duration::from_millis(300);
    let client = EtcdBackend::connect_with(
        EtcdConfig::new([
            store.endpoint_via(slow.addr()),
            store.endpoint_via(fast.addr()),
        ])
        .request_timeout(timeout),
    )
    .await
    .unwrap();
    let observer = EtcdBackend::connect_with(EtcdConfig::new([store.endpoint()]))
        .await
        .unwrap();
    let slack = client.capabilities().slack_for(TTL) + scaled(Duration::from_secs(1));

    // Both connections up before one of them turns slow.
    until(
        Duration::from_secs(10),
        "a connection through each proxy",
        || async {
            let _ = client.inspect(&numbered("warm-up", 0)).await;
            slow.connections() > 0 && fast.connections() > 0
        },
    )
    .await;

    for round in 0..ROUNDS {
        // The slow proxy turns slow until one acquire went through it and
        // gave up; once that acquire's put has landed, it is fast again.
        slow.set(Mode::Delay {
            base: late,
            jitter: Duration::ZERO,
        });
        let mut granted = Vec::new();
        let (lock, sent) = loop {
            assert!(granted.len() < 40, "no acquire went through the slow proxy");
            let lock = numbered("blind", round);
            let sent = Instant::now();
            match client.try_acquire_for(&lock, TTL).await {
                // Through the fast proxy: released once the slow one is fast.
                Ok(Attempt::Acquired(lease)) => granted.push(lease),
                Ok(Attempt::Held { .. }) => panic!("{lock} is fresh, nobody holds it"),
                Err(e) => {
                    assert!(e.is_retryable(), "{e:?}");
                    break (lock, sent);
                }
            }
        };
        tokio::time::sleep_until(sent + late + Duration::from_millis(50)).await;
        slow.set(Mode::Pass);

        // The client stays busy, as a service holding many locks does: each
        // cycle takes every lease in its pool.
        let busy = CancellationToken::new();
        let churn = tokio::spawn(churn(client.clone(), granted, busy.clone()));
        let bound = sent + late + TTL + slack;
        let within = bound.saturating_duration_since(Instant::now());
        let what = format!(
            "L1: round {round}: {lock} free within the put's delay + TTL + slack ({:?}) of its acquire",
            late + TTL + slack
        );
        let lease = eventually(within, &what, || async {
            observer
                .try_acquire_for(&lock, TTL)
                .await
                .ok()?
                .into_lease()
        })
        .await;
        observer.release(&lease).await.unwrap();
        busy.cancel();
        churn.await.unwrap();
    }
}

/// Releases `granted`, then acquires and releases 16 names over and over
/// until `stop`.
async fn churn(client: EtcdBackend, granted: Vec<Lease>, stop: CancellationToken) {
    for lease in granted {
        let _ = client.release(&lease).await;
    }
    let names: Vec<LockName> = (0..16).map(|i| numbered("busy", i)).collect();
    while !stop.is_cancelled() {
        let mut held = Vec::new();
        for lock in &names {
            if let Ok(Attempt::Acquired(lease)) = client.try_acquire_for(lock, TTL).await {
                held.push(lease);
            }
        }
        for lease in held {
            let _ = client.release(&lease).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An acquire whose reply comes too late (the put landed, the client gave
/// up on it) retires the client's session: never refreshed again, so the
/// unseen entry goes with it. A lock held on that session meanwhile is not
/// lost: its next renewal moves it to a new session, keeping its key and
/// fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_an_answer_retires_the_session_and_its_locks_move_on() {
    let store = etcd::shared();
    let timeout = scaled(Duration::from_millis(500));
    let (proxy, client) = behind_proxy(&store, timeout).await;
    let observer = EtcdBackend::connect_with(EtcdConfig::new([store.endpoint()]))
        .await
        .unwrap();
    let mut raw = raw(&store.endpoint()).await;
    let locker = lockcore::Locker::new(client.clone())
        .ttl(TTL)
        .renew_every(TTL / 4);
    let kept = locker.acquire(numbered("kept", 0)).await.unwrap();
    let session = etcd_lease_of(&mut raw, &key_of(&kept.lease()).unwrap()).await;

    // Replies come late: the put lands, the client hears nothing in time.
    let late = timeout * 2;
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    let phantom = numbered("phantom", 0);
    let sent = Instant::now();
    let err = client.try_acquire_for(&phantom, TTL).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    proxy.set(Mode::Pass);
    until(Duration::from_secs(5), "the landed put's entry", || async {
        observer.inspect(&phantom).await.unwrap().is_some()
    })
    .await;

    // The phantom goes with the retired session, within its TTL + slack.
    let slack = client.capabilities().slack_for(TTL) + scaled(Duration::from_secs(1));
    let within = (sent + late + TTL + slack).saturating_duration_since(Instant::now());
    let lease = eventually(within, "the phantom's name free again", || async {
        observer
            .try_acquire_for(&phantom, TTL)
            .await
            .ok()?
            .into_lease()
    })
    .await;
    observer.release(&lease).await.unwrap();

    // The held lock moved on with its fence, and was never lost.
    let key = key_of(&kept.lease()).unwrap();
    let moved = eventually(
        scaled(Duration::from_secs(5)),
        "the kept lock on a new session",
        || {
            let (mut raw, key) = (raw.clone(), key.clone());
            async move {
                let now = raw.get(key, None).await.ok()?.kvs().first()?.lease();
                (now != session).then_some(now)
            }
        },
    )
    .await;
    assert_ne!(moved, session);
    assert!(kept.is_held(), "the lock on the retired session was lost");
    let view = observer
        .inspect(kept.lease().name())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.fence, kept.fencing_token(), "same grant, same fence");
    kept.release().await.unwrap();
}

/// etcd's keep-alive replies carry no request id: a keep-alive given up on
/// mid-flight (a renewal's caller timed out) leaves its reply on the stream.
/// Here that reply comes late, after the renewal was cancelled; a later
/// refresh whose own keep-alive is lost must not take it as its answer and
/// date the session from its own send, or a lock written to the session
/// next claims time etcd never granted. Compared with etcd's own count of
/// the session's time left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_reply_that_comes_after_its_cancellation_extends_nothing() {
    let store = etcd::shared();
    let timeout = scaled(Duration::from_millis(800));
    let (proxy, client) = behind_proxy(&store, timeout).await;
    let mut raw = raw(&store.endpoint()).await;
    let ttl = Duration::from_secs(10);
    let first = client
        .try_acquire_for(&numbered("late-reply", 0), ttl)
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    let session = etcd_lease_of(&mut raw, &key_of(&first).unwrap()).await;
    // Opens the session's keep-alive stream.
    let first = client.renew(&first).await.unwrap();

    // A renewal whose keep-alive reaches etcd, and whose reply comes only
    // after the renewal was given up on.
    let late = scaled(Duration::from_millis(500));
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    let kept_alive = Instant::now();
    let cancelled = tokio::time::timeout(late / 4, client.renew(&first)).await;
    assert!(
        cancelled.is_err(),
        "the renewal should still have been waiting"
    );
    proxy.set(Mode::Pass);
    // The session is no longer fresh enough for a new lock without a refresh.
    tokio::time::sleep_until(kept_alive + ttl / 4 + late).await;

    // The next keep-alive is lost (and the renewal's check with it).
    proxy.set(Mode::Blackhole);
    let outcome = client.renew(&first).await;
    assert!(
        outcome.is_err(),
        "renewed through a black hole: {outcome:?}"
    );
    proxy.set(Mode::Pass);

    // A new lock on the session: it may claim only what etcd grants.
    let second = client
        .try_acquire_for(&numbered("late-reply", 1), ttl)
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    let claimed = second.remaining();
    let key = key_of(&second).unwrap();
    let on = etcd_lease_of(&mut raw, &key).await;
    let left = raw.lease_time_to_live(on, None).await.unwrap().ttl();
    // etcd truncates to whole seconds.
    let granted = Duration::from_secs(u64::try_from(left).unwrap_or(0) + 1);
    eprintln!(
        "session {session:x} then {on:x}: the lock claims {claimed:?}, etcd keeps it {left} s more"
    );
    assert!(
        claimed <= granted,
        "the lock claims {claimed:?} but etcd keeps its session only {left} s more: \
         a late keep-alive reply was taken for a later keep-alive's"
    );
    client.release(&second).await.unwrap();
}

/// `n` locks of `ttl` held by `client` on fresh names, acquired a few at a
/// time.
async fn hold_many(client: &EtcdBackend, test: &str, n: usize, ttl: Duration) -> Vec<Lease> {
    use futures_util::StreamExt;
    futures_util::stream::iter(0..n)
        .map(|i| async move { acquire(client, &numbered(test, i), ttl).await })
        .buffered(16)
        .collect()
        .await
}

/// etcd refuses a transaction of more operations than its `--max-txn-ops`
/// (128 unless raised). A renewal checks its keys in one transaction, and a
/// batch just under, at and over that size must renew every lease: the
/// check's own extra read (the fence floor) must not push a batch over.
/// (Over it, the check asks the session's lease which keys it carries
/// instead.) Either way, a key deleted behind the client's back is judged
/// alone: its renewal is refused and its loss signal fires, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_batches_around_etcds_transaction_limit_renew_every_lease() {
    let store = etcd::shared();
    let client = connect(&store.endpoint()).await;
    let mut raw = raw(&store.endpoint()).await;
    for n in [127, 128, 129] {
        let mut leases = hold_many(&client, &format!("batch-{n}"), n, TTL).await;
        let gone = leases.pop().expect("a lease to delete");
        raw.delete(key_of(&gone).unwrap(), None).await.unwrap();
        leases.push(gone.clone());
        let mut renewed = client.renew_many(&leases).await;
        let refused = renewed.pop().expect("the deleted key's renewal");
        assert!(
            matches!(refused, Err(LockError::NotHeld { .. })),
            "a batch of {n}: the deleted key's renewal: {refused:?}"
        );
        assert!(
            gone.loss_signal().is_some_and(|lost| lost.is_cancelled()),
            "a batch of {n}: the deleted key's loss signal did not fire"
        );
        let failed: Vec<String> = renewed
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        assert!(
            failed.is_empty(),
            "a batch of {n}: {} of the {} others' renewals failed, first: {:?}",
            failed.len(),
            n - 1,
            failed.first()
        );
        for lease in renewed {
            client.release(&lease.unwrap()).await.unwrap();
        }
    }
}

/// Retires the session `held` is on (the client's only one), `client`
/// behind `proxy` with request timeout `timeout`: an acquire whose reply
/// comes too late retires it. (One that timed out before its write, on a
/// busy machine, retires nothing: try again.) Each attempt starts on the
/// session just refreshed, or it would first refresh it (once it is no
/// longer fresh enough), and that refresh, its reply late too, would time
/// out before the write left.
async fn retire(proxy: &FaultProxy, client: &EtcdBackend, held: &Lease, timeout: Duration) {
    for attempt in 0.. {
        assert!(attempt < 5, "the session was never retired");
        let refreshed = client.renew(held).await;
        assert!(refreshed.is_ok(), "{refreshed:?}");
        proxy.set(Mode::DelayDownstream {
            base: timeout * 2,
            jitter: Duration::ZERO,
        });
        let err = client
            .try_acquire_for(&numbered("retiring-phantom", attempt), held.ttl().get())
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        proxy.set(Mode::Pass);
        if sessions(client) == 0 {
            break;
        }
    }
}

/// The keys of a retired session move to a new one in transactions too
/// (each key a nested transaction, whose operations count against what its
/// parent leaves): more keys than one transaction may carry all move, and
/// every lease on them is renewed, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_keys_than_one_transaction_carries_all_move_off_a_retired_session() {
    const HELD: usize = 300;
    let store = etcd::shared();
    let timeout = scaled(Duration::from_millis(500));
    let (proxy, client) = behind_proxy(&store, timeout).await;
    let mut raw = raw(&store.endpoint()).await;
    // Long enough for the retired session's keys to wait for their move
    // on a busy machine: the session is refreshed no more once retired.
    let ttl = scaled(Duration::from_secs(15));
    let leases = hold_many(&client, "moved", HELD, ttl).await;
    let session = etcd_lease_of(&mut raw, &key_of(&leases[0]).unwrap()).await;

    retire(&proxy, &client, &leases[0], timeout).await;

    // Renewed as the renewer would: a retryable failure (the new session's
    // grant slow on a busy machine) is tried again, anything else fails.
    let within = scaled(Duration::from_secs(5));
    let renewed = eventually(within, "every lease renewed", || async {
        let renewed = client.renew_many(&leases).await;
        if let Some(e) = renewed.iter().find_map(|r| r.as_ref().err()) {
            assert!(e.is_retryable(), "a renewal failed: {e}");
            return None;
        }
        Some(renewed)
    })
    .await;
    for lease in &leases {
        let now = etcd_lease_of(&mut raw, &key_of(lease).unwrap()).await;
        assert_ne!(
            now,
            session,
            "{} still on the retired session",
            lease.name()
        );
    }
    for lease in renewed {
        // The client's short request timeout may cut a release short on a
        // busy machine: the key then goes with its session.
        match client.release(&lease.unwrap()).await {
            Err(e) if !e.is_retryable() => panic!("a release failed: {e}"),
            _ => {}
        }
    }
}

/// A new grant on a session last proved alive more than a quarter of its
/// TTL ago refreshes it first, so the grant's lease counts from a proof no
/// older than that, and the grant gets at least 3/4 of its TTL. (Nothing
/// else refreshes this session meanwhile: it carries a held lock and no
/// waiter, and no renewer runs here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_on_a_stale_session_refreshes_it_first() {
    let client = connect(&etcd::shared().endpoint()).await;
    let first = acquire(&client, &name("stale-first"), TTL).await;
    tokio::time::sleep(TTL / 4 + scaled(Duration::from_millis(200))).await;
    let called = first.now();
    assert!(
        called.since(first.issued()) > TTL / 4,
        "the session is stale"
    );
    let second = acquire(&client, &name("stale-second"), TTL).await;
    let age = called.since(second.issued());
    assert!(
        age <= TTL / 4,
        "the grant's lease counts from a proof {age:?} old when it was asked for"
    );
    client.release(&first).await.unwrap();
    client.release(&second).await.unwrap();
}

/// A renewal whose keep-alive fails on a broken connection (reset, not
/// answered "lease not found") fails retryably and takes nothing from the
/// session: once the link heals, the next renewal of the same lease
/// succeeds. Only etcd saying the lease is gone ends a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_cut_by_a_reset_ends_no_session() {
    let store = etcd::shared();
    let (proxy, client) = behind_proxy(&store, scaled(Duration::from_secs(2))).await;
    let lease = acquire(&client, &name("reset-keep-alive"), TTL).await;
    proxy.set(Mode::Reset);
    let cut = client.renew(&lease).await;
    assert!(
        cut.as_ref().is_err_and(LockError::is_retryable),
        "a renewal over a reset link: {cut:?}"
    );
    proxy.set(Mode::Pass);
    let renewed = renewed_once_healed(&client, &lease).await;
    client.release(&renewed).await.unwrap();
}

/// A key gone from a retired session (deleted behind the client's back)
/// is not moved: the move finds nothing on the old session, and its read
/// does not show the key on the new one, so the renewal is refused and the
/// loss fires. Never taken for moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_gone_from_a_retired_session_is_not_moved() {
    let store = etcd::shared();
    let timeout = scaled(Duration::from_millis(500));
    let (proxy, client) = behind_proxy(&store, timeout).await;
    let mut raw = raw(&store.endpoint()).await;
    let ttl = scaled(Duration::from_secs(15));
    let kept = acquire(&client, &name("move-kept"), ttl).await;
    let gone = acquire(&client, &name("move-gone"), ttl).await;
    retire(&proxy, &client, &kept, timeout).await;
    raw.delete(key_of(&gone).unwrap(), None).await.unwrap();
    let renewed = eventually(scaled(Duration::from_secs(5)), "the move", || async {
        let renewed = client.renew_many(&[kept.clone(), gone.clone()]).await;
        if renewed
            .iter()
            .any(|r| r.as_ref().is_err_and(LockError::is_retryable))
        {
            return None;
        }
        Some(renewed)
    })
    .await;
    assert!(renewed[0].is_ok(), "the kept lock: {:?}", renewed[0]);
    assert!(
        matches!(renewed[1], Err(LockError::NotHeld { .. })),
        "the deleted key: {:?}",
        renewed[1]
    );
    assert!(gone.loss_signal().is_some_and(|lost| lost.is_cancelled()));
    client.release(renewed[0].as_ref().unwrap()).await.unwrap();
}

/// A move whose reply was lost landed: its retry finds the key on the new
/// session already (same create revision and value) and counts it as
/// moved. The lock is kept, not lost to its own earlier move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_reply_was_lost_is_counted_on_its_retry() {
    let store = etcd::shared();
    let timeout = scaled(Duration::from_millis(500));
    let (proxy, client) = behind_proxy(&store, timeout).await;
    let mut raw = raw(&store.endpoint()).await;
    let ttl = scaled(Duration::from_secs(15));
    let held = acquire(&client, &name("move-lost-reply"), ttl).await;
    let retired = etcd_lease_of(&mut raw, &key_of(&held).unwrap()).await;
    retire(&proxy, &client, &held, timeout).await;
    // A new session of the same TTL to move to, fresh (the move then sends
    // nothing before its write).
    let target_name = name("move-target");
    let other = eventually(scaled(Duration::from_secs(5)), "a new session", || async {
        match client.try_acquire_for(&target_name, ttl).await {
            Ok(attempt) => Some(attempt.into_lease().expect("a free name")),
            Err(e) if e.is_retryable() => None,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    let target = etcd_lease_of(&mut raw, &key_of(&other).unwrap()).await;
    assert_ne!(target, retired);
    proxy.set(Mode::DelayDownstream {
        base: timeout * 2,
        jitter: Duration::ZERO,
    });
    let late = client.renew(&held).await;
    proxy.set(Mode::Pass);
    assert!(
        late.as_ref().is_err_and(LockError::is_retryable),
        "{late:?}"
    );
    // The move landed (the target was fresh: nothing went before it).
    let on = etcd_lease_of(&mut raw, &key_of(&held).unwrap()).await;
    assert_eq!(on, target, "the move did not land");
    // Retried until the late replies still in the link have gone by.
    let renewed = renewed_once_healed(&client, &held).await;
    assert!(!held.loss_signal().is_some_and(|lost| lost.is_cancelled()));
    client.release(&renewed).await.unwrap();
    client.release(&other).await.unwrap();
}

/// An acquire whose write fails on a broken connection retires its session
/// (the write may still land) and fails retryably; the locks already on
/// that session are kept (moved on at their next renewal), not taken for
/// lost with a session etcd never said was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_by_a_reset_keeps_the_sessions_locks() {
    let store = etcd::shared();
    let (proxy, client) = behind_proxy(&store, scaled(Duration::from_secs(2))).await;
    let held = acquire(&client, &name("reset-write-held"), TTL).await;
    proxy.set(Mode::Reset);
    let cut = client.try_acquire_for(&name("reset-write"), TTL).await;
    proxy.set(Mode::Pass);
    assert!(
        cut.as_ref().is_err_and(LockError::is_retryable),
        "an acquire over a reset link: {cut:?}"
    );
    let renewed = renewed_once_healed(&client, &held).await;
    client.release(&renewed).await.unwrap();
}

/// A write refused because etcd no longer has the session's lease (revoked
/// behind the client's back, before the client heard) is made again at
/// once on a new session: the acquire succeeds, it does not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_a_session_etcd_dropped_is_made_again_on_a_new_one() {
    let store = etcd::shared();
    let (proxy, client) = behind_proxy(&store, scaled(Duration::from_secs(5))).await;
    let mut raw = raw(&store.endpoint()).await;
    let first = acquire(&client, &name("dropped-first"), TTL).await;
    let session = etcd_lease_of(&mut raw, &key_of(&first).unwrap()).await;
    // The client hears of the revoke late (its marker's delete is delayed
    // on the link), after its next write left.
    proxy.set(Mode::DelayDownstream {
        base: scaled(Duration::from_millis(300)),
        jitter: Duration::ZERO,
    });
    raw.lease_revoke(session).await.unwrap();
    let second = acquire(&client, &name("dropped-second"), TTL).await;
    proxy.set(Mode::Pass);
    let on = etcd_lease_of(&mut raw, &key_of(&second).unwrap()).await;
    assert_ne!(on, session, "granted on the dropped session");
    client.release(&second).await.unwrap();
}

/// `lease` renewed once the link has healed: retryable failures (late
/// replies still in the link) are tried again for up to 5 s (scaled);
/// anything else fails the test.
async fn renewed_once_healed(client: &EtcdBackend, lease: &Lease) -> Lease {
    eventually(scaled(Duration::from_secs(5)), "a renewal", || async {
        match client.renew(lease).await {
            Ok(renewed) => Some(renewed),
            Err(e) if e.is_retryable() => None,
            Err(e) => panic!("the renewal of {} failed: {e:?}", lease.name()),
        }
    })
    .await
}

/// A wait dropped while the write of its entry in line is in flight (its
/// caller timed out or was cancelled). The entry lands, on a session the
/// client keeps alive for another lock; it must be undone, not left in line
/// for as long as that session lives: there it would be handed the lock
/// at the holder's release, and hold it for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_while_its_entry_is_in_flight_leaves_nobody_in_line() {
    let store = etcd::shared();
    let (proxy, client) = behind_proxy(&store, scaled(Duration::from_secs(5))).await;
    let other = connect(&store.endpoint()).await;
    let mut raw = raw(&store.endpoint()).await;
    let locker = Locker::new(client.clone()).ttl(TTL);
    let kept = locker.acquire(&name("in-flight-kept")).await.unwrap();
    let wanted = name("in-flight-entry");
    let held = acquire(&other, &wanted, TTL).await;
    let queue = queue_of(&held);
    let late = round_trip(&other).await + scaled(Duration::from_millis(300));
    proxy.set(Mode::DelayDownstream {
        base: late,
        jitter: Duration::ZERO,
    });
    let wait = tokio::spawn({
        let (locker, wanted) = (locker.clone(), wanted.clone());
        async move { locker.acquire(&wanted).await }
    });
    until(scaled(Duration::from_secs(10)), "the entry in line", || {
        let (mut raw, queue) = (raw.clone(), queue.clone());
        async move { queue_len(&mut raw, queue).await == 2 }
    })
    .await;
    assert!(!wait.is_finished(), "the wait ended before it was dropped");
    wait.abort();
    let _ = wait.await;
    proxy.set(Mode::Pass);
    other.release(&held).await.unwrap();
    let within = TTL + other.capabilities().slack_for(TTL) + scaled(Duration::from_secs(1));
    let next = eventually(within, "the name free after the dropped wait", || async {
        other
            .try_acquire_for(&wanted, TTL)
            .await
            .unwrap()
            .into_lease()
    })
    .await;
    let entries = queue_len(&mut raw, queue).await;
    assert_eq!(
        entries, 1,
        "the queue holds {entries} entries, not only the holder's"
    );
    assert!(kept.is_held(), "the lock beside the dropped wait was lost");
    other.release(&next).await.unwrap();
    kept.release().await.unwrap();
}

/// A `try_acquire` dropped while its `Txn` is in flight deletes the entry
/// that `Txn` put, at once (README, C1): the name is free within round
/// trips, not only once the session carrying the entry is gone. Another
/// lock on the same session, never renewed, keeps that session (retired
/// by the drop) alive for its whole TTL, so only the delete can free the
/// name in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_dropped_in_flight_deletes_its_entry_at_once() {
    let ttl = scaled(Duration::from_secs(30));
    let store = etcd::shared();
    let (proxy, client) = behind_proxy(&store, ttl).await;
    let other = connect(&store.endpoint()).await;
    let kept_name = name("in-flight-attempt-kept");
    let kept = acquire(&client, &kept_name, ttl).await;
    let wanted = name("in-flight-attempt");
    let rt = round_trip(&other).await;
    proxy.set(Mode::DelayDownstream {
        base: rt + scaled(Duration::from_millis(300)),
        jitter: Duration::ZERO,
    });
    let attempt = tokio::spawn({
        let (client, wanted) = (client.clone(), wanted.clone());
        async move { client.try_acquire_for(&wanted, ttl).await }
    });
    let seen = eventually(
        scaled(Duration::from_secs(10)),
        "the attempt's entry in the store",
        || async { other.inspect(&wanted).await.unwrap() },
    )
    .await;
    assert!(
        !attempt.is_finished(),
        "the attempt ended before it was dropped"
    );
    attempt.abort();
    let _ = attempt.await;
    proxy.set(Mode::Pass);
    // Far inside the TTL, the only other way the entry could go.
    let within = 10 * rt + scaled(Duration::from_secs(1));
    assert!(
        within < ttl / 4,
        "round trips of {rt:?} leave the test no room"
    );
    let next = eventually(
        within,
        "the name free after the dropped attempt",
        || async {
            other
                .try_acquire_for(&wanted, ttl)
                .await
                .unwrap()
                .into_lease()
        },
    )
    .await;
    assert!(
        next.fence() > seen.fence,
        "fence {} after the dropped attempt is not above its {}",
        next.fence(),
        seen.fence
    );
    let holder = other.inspect(&kept_name).await.unwrap();
    assert_eq!(
        holder.map(|h| h.fence),
        Some(kept.fence()),
        "the lock beside the dropped attempt was lost"
    );
    other.release(&next).await.unwrap();
    client.release(&kept).await.unwrap();
}
