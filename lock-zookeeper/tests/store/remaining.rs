//! `set_remaining`: a lock node kept as a TTL node outlives its client's
//! session, keeps its place and fence, wakes its waiters only when the
//! servers delete it, and is released, evicted or kept again only as its
//! grant; servers without TTL nodes refuse it, saying which setting is
//! missing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lockcore::backend::LockBackendExt;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{LockBackend, LockError, Locker, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::{
    children, connect, container_check_interval, kill_session, may_launch_servers, raw, round_trip,
    short_lived, take, tick, unique,
};

/// A name kept by `set_remaining` stays taken after its holder's session
/// is closed (its ephemeral nodes gone): by the same node, with the same
/// fence and label, and a waiter queued before the call is not let through
/// by the transaction that replaced the node. The waiter is granted, with a
/// larger fence, no sooner than the remaining time after the call was sent,
/// and within the servers' sweep of TTL nodes (plus a tick, what the
/// capabilities declare for kept leases) and a round trip after it returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_name_outlives_its_clients_session() {
    let store = zookeeper::shared();
    let (holder, waiter, other) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let caps = holder.capabilities();
    assert!(caps.sets_remaining, "the kit's servers keep TTL nodes");
    assert!(
        caps.expiry_slack >= container_check_interval() + tick(),
        "{caps:?}"
    );
    let name = unique("kept");
    let parent = holder.lock_path(&name);
    let lease = take(&holder, &name).await;
    let before = other.inspect(&name).await.unwrap().unwrap();
    let queued = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move {
            let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(60));
            let granted = waiter.acquire_for(&name, waiter.session_timeout(), &wait);
            (granted.await, Instant::now())
        }
    });
    until(Duration::from_secs(10), "the waiter in line", || async {
        children(&observer, &parent).await.len() == 2
    })
    .await;
    let sorted = |mut nodes: Vec<String>| {
        nodes.sort();
        nodes
    };
    let line = sorted(children(&observer, &parent).await);
    let remaining = caps
        .effective_remaining(scaled(Duration::from_secs(3)))
        .unwrap();
    let sent = Instant::now();
    let kept = holder.set_remaining(&lease, remaining).await.unwrap();
    let returned = Instant::now();
    assert!(kept.same_grant(&lease) && kept.ttl() == remaining);
    assert_eq!(
        sorted(children(&observer, &parent).await),
        line,
        "the node kept its place"
    );
    holder.close().await.unwrap();
    let node = line
        .iter()
        .find(|n| n.contains(&lease.owner().as_uuid().hyphenated().to_string()))
        .expect("the holder's node");
    let (_, stat) = observer
        .get_data(&format!("{parent}/{node}"))
        .await
        .expect("the kept node outlives its session");
    assert_eq!(stat.ephemeral_owner, 0, "a TTL node, no session's");
    assert!(stat.czxid > lease.fence().get() as i64);
    // Taken all along, by the same grant.
    let held = other.inspect(&name).await.unwrap().expect("still held");
    assert_eq!(
        (held.fence, held.owner, &held.label),
        (lease.fence(), before.owner, &before.label)
    );
    assert!(
        other
            .try_acquire_for(&name, other.session_timeout())
            .await
            .unwrap()
            .into_lease()
            .is_none(),
        "another client took a kept name"
    );
    assert!(!queued.is_finished(), "the waiter went through a kept name");
    let (granted, at) = queued.await.unwrap();
    let granted = granted.unwrap().expect("the waiter is granted");
    let bound = remaining.get() + container_check_interval() + tick() + round_trip(&other).await;
    eprintln!(
        "kept for {remaining}: granted {:?} after the call was sent (bound {bound:?} after it returned)",
        at - sent
    );
    assert!(
        at >= sent + remaining.get(),
        "granted {:?} after the call was sent, before {remaining}",
        at - sent
    );
    assert!(
        at <= returned + bound,
        "granted {:?} after the call returned, past {bound:?}",
        at - returned
    );
    assert!(granted.fence() > lease.fence());
    assert_eq!(
        waiter.release(&granted).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A kept lease is released, renewed (its remaining time set to its TTL
/// again) and evicted as its grant: by its owner, or by an admin naming its
/// fence; once gone it is never kept again, and the next grant's fence is
/// larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_is_released_renewed_and_evicted_as_its_grant() {
    let store = zookeeper::shared();
    let (holder, other) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let long = long(&holder);

    // Released by its owner.
    let name = unique("kept-released");
    let lease = take(&holder, &name).await;
    let kept = holder.set_remaining(&lease, long).await.unwrap();
    let renewed = holder.renew(&kept).await.unwrap();
    assert!(renewed.same_grant(&lease) && renewed.ttl() == long);
    assert_eq!(
        other.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(lease.fence())
    );
    assert_eq!(
        holder.release(&kept).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        holder.release(&kept).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    let next = take(&other, &name).await;
    assert!(next.fence() > lease.fence());
    let stale = holder.set_remaining(&kept, long).await;
    assert!(matches!(stale, Err(LockError::NotHeld { .. })), "{stale:?}");
    other.release(&next).await.unwrap();

    // Evicted by its fence, its client closed.
    let name = unique("kept-evicted");
    let lease = take(&holder, &name).await;
    let kept = holder.set_remaining(&lease, long).await.unwrap();
    let wrong = lockcore::FencingToken::new(lease.fence().get() + 1).unwrap();
    assert!(other.evict(&name, Some(wrong)).await.unwrap().is_none());
    let evicted = other.evict(&name, Some(lease.fence())).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    assert!(other.inspect(&name).await.unwrap().is_none());
    for again in [
        holder.set_remaining(&kept, long).await,
        holder.renew(&kept).await,
    ] {
        assert!(matches!(again, Err(LockError::NotHeld { .. })), "{again:?}");
    }
    assert!(
        other.inspect(&name).await.unwrap().is_none(),
        "never kept again"
    );
    let next = take(&other, &name).await;
    assert!(next.fence() > lease.fence());
    other.release(&next).await.unwrap();
}

/// Servers without TTL nodes (`zookeeper.extendedTypesEnabled` unset): the
/// capabilities say so, `set_remaining` is `Unsupported` with a log line
/// naming the setting, the lease is left as it was, and a job with
/// `at_least` is refused before it takes anything.
#[tokio::test]
async fn servers_without_ttl_nodes_refuse_set_remaining_clearly() {
    if !may_launch_servers("servers_without_ttl_nodes_refuse_set_remaining_clearly") {
        return;
    }
    let log = Capture::default();
    let _capturing = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(log.clone())
            .finish(),
    );
    let mut options = zookeeper::Options::default();
    options.extended_types = false;
    let store = tokio::task::spawn_blocking(move || zookeeper::start(options))
        .await
        .unwrap()
        .unwrap();
    let client = connect(store.endpoint()).await.unwrap();
    let caps = client.capabilities();
    assert!(!caps.sets_remaining, "{caps:?}");
    let said = log.text();
    assert!(
        said.contains("zookeeper.extendedTypesEnabled=true") && said.contains("INFO"),
        "connect says why set_remaining is unsupported: {said}"
    );
    let name = unique("no-ttl");
    let lease = take(&client, &name).await;
    let remaining = caps.effective_remaining(Duration::from_secs(5)).unwrap();
    let refused = client.set_remaining(&lease, remaining).await;
    assert!(
        matches!(
            refused,
            Err(LockError::Unsupported {
                backend: "zookeeper",
                operation: "set_remaining"
            })
        ),
        "{refused:?}"
    );
    let said = log.text();
    let warning = said
        .lines()
        .find(|l| l.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning: {said}"));
    assert!(
        warning.contains("-Dzookeeper.extendedTypesEnabled=true")
            && warning.contains("set_remaining is unsupported")
            && warning.contains(name.as_str()),
        "{warning}"
    );
    // Nothing changed: still held, by its session.
    assert!(!lease.is_expired());
    client.renew(&lease).await.unwrap();
    assert_eq!(
        client.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(lease.fence())
    );
    client.release(&lease).await.unwrap();
    let job = Locker::new(client.clone()).job(&name).unwrap();
    let ran = (job.at_most(Duration::from_secs(10)))
        .at_least(Duration::from_secs(1))
        .run(|_| async {})
        .await;
    assert!(matches!(ran, Err(LockError::Unsupported { .. })), "{ran:?}");
    assert!(client.inspect(&name).await.unwrap().is_none());
    client.close().await.unwrap();
}

/// What this thread logs, for one test.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

/// A keep answered only after the lease's local deadline: the deadline
/// passing while the node is being kept deletes nothing (the transaction
/// has replaced the node by then), so the kept node stays with the
/// grant's fence, and the name stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_answered_after_the_deadline_keeps_the_node() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let holder = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    let other = connect(store.endpoint()).await.unwrap();
    let name = unique("kept-late");
    let left = scaled(Duration::from_millis(500));
    let lease = short_lived(&holder, &name, left).await;
    let long = long(&holder);
    proxy.set(Mode::DelayDownstream {
        base: left * 3,
        jitter: Duration::ZERO,
    });
    let kept = holder.set_remaining(&lease, long).await;
    proxy.set(Mode::Pass);
    assert!(
        Instant::now() > lease.deadline(),
        "the keep was answered before the deadline"
    );
    let kept = kept.unwrap();
    assert_eq!(
        other.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(lease.fence()),
        "the kept node"
    );
    let ttl = other.session_timeout();
    let taken = other.try_acquire_for(&name, ttl).await.unwrap();
    assert!(taken.into_lease().is_none(), "the kept name was granted");
    assert_eq!(
        holder.release(&kept).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A keep that finds the node gone (evicted before the holder heard of it)
/// says not held and fires the lease's loss signal: the grant is lost, not
/// quietly dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_that_finds_the_node_evicted_loses_the_lease() {
    let store = zookeeper::shared();
    let (holder, admin) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let long = long(&holder);
    let name = unique("kept-evicted");
    let lease = take(&holder, &name).await;
    let evicted = admin.evict(&name, Some(lease.fence())).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    let kept = holder.set_remaining(&lease, long).await;
    assert!(matches!(kept, Err(LockError::NotHeld { .. })), "{kept:?}");
    assert!(
        lease.loss_signal().unwrap().is_cancelled(),
        "the evicted lease was not reported lost"
    );
}

/// A kept lease its owner released is over: a later renew or release says
/// not held without a request to the servers (nothing is kept again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_kept_lease_asks_the_servers_nothing_more() {
    let store = zookeeper::shared();
    let holder = connect(store.endpoint()).await.unwrap();
    let long = long(&holder);
    let name = unique("kept-over");
    let lease = take(&holder, &name).await;
    let kept = holder.set_remaining(&lease, long).await.unwrap();
    assert_eq!(
        holder.release(&kept).await.unwrap(),
        ReleaseOutcome::Released
    );
    let sid = crate::support::session_id(&holder);
    let before = crate::support::answered(store.addr(), sid);
    let renewed = holder.renew(&kept).await;
    assert!(
        matches!(renewed, Err(LockError::NotHeld { .. })),
        "{renewed:?}"
    );
    let kept_again = holder.set_remaining(&kept, long).await;
    assert!(
        matches!(kept_again, Err(LockError::NotHeld { .. })),
        "{kept_again:?}"
    );
    assert_eq!(
        crate::support::answered(store.addr(), sid),
        before,
        "requests sent for a released lease"
    );
}

/// A kept lease evicted before its owner let it go (the owner no longer
/// watches a kept node, so it has not heard): the owner's release says not
/// held, since its delete found nothing, and the name is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_an_evicted_kept_lease_says_not_held() {
    let store = zookeeper::shared();
    let (holder, admin) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let long = long(&holder);
    let name = unique("kept-evicted-released");
    let lease = take(&holder, &name).await;
    let kept = holder.set_remaining(&lease, long).await.unwrap();
    let evicted = admin.evict(&name, Some(kept.fence())).await.unwrap();
    assert_eq!(evicted.map(|h| h.fence), Some(lease.fence()));
    assert_eq!(
        holder.release(&kept).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "a release that deleted nothing"
    );
    let next = take(&admin, &name).await;
    assert!(next.fence() > lease.fence());
    admin.release(&next).await.unwrap();
}

/// A lease whose session ended (closed on the servers, its node with it)
/// is never kept: `set_remaining` says not held, before anything else
/// looked at the lease, and the name stays free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_session_ended_is_never_kept() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let holder = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    let other = connect(store.endpoint()).await.unwrap();
    let long = long(&holder);
    let name = unique("kept-session-ended");
    let lease = take(&holder, &name).await;
    kill_session(&store, &proxy, &holder, || async {
        other.inspect(&name).await.unwrap().is_none()
    })
    .await;
    // The client hears of it once it reconnects (a session expiry).
    let within = holder.session_timeout() * 2;
    let lost = lease.loss_signal().unwrap();
    tokio::time::timeout(within, lost.cancelled())
        .await
        .expect("the lease reported lost once its session ended");
    let kept = holder.set_remaining(&lease, long).await;
    assert!(matches!(kept, Err(LockError::NotHeld { .. })), "{kept:?}");
    assert!(
        other.inspect(&name).await.unwrap().is_none(),
        "the name was kept"
    );
}

/// A remaining time far longer than any test: the kept node outlives it.
fn long(backend: &lock_zookeeper::ZooKeeperBackend) -> lockcore::backend::Ttl {
    (backend.capabilities())
        .effective_remaining(Duration::from_secs(600))
        .unwrap()
}

/// A kept lease past its local deadline is never kept again: the servers
/// may sweep its node at any moment. Its deadline counts on its own clock,
/// here one behind the system's, so it has passed while the node is
/// surely still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_past_its_deadline_is_never_kept_again() {
    let store = zookeeper::shared();
    let holder = connect(store.endpoint()).await.unwrap();
    let name = unique("kept-past");
    let lease = short_lived(&holder, &name, scaled(Duration::from_millis(500))).await;
    let remaining = (holder.capabilities())
        .effective_remaining(scaled(Duration::from_secs(1)))
        .unwrap();
    let kept = holder.set_remaining(&lease, remaining).await.unwrap();
    assert!(
        Instant::now() >= kept.deadline(),
        "kept on a clock behind: its deadline has passed"
    );
    let again = holder.set_remaining(&kept, long(&holder)).await;
    assert!(matches!(again, Err(LockError::NotHeld { .. })), "{again:?}");
}
