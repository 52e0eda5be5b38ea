//! Multi-locks in one script (`try_acquire_each`): a refused attempt writes
//! nothing (no lock, no fence), a name a waiter is owed counts as held, a
//! lost reply is undone lease by lease, a grant the replicas lack or made
//! inside a failover's lock delay is not handed out, and on a Redis
//! Cluster only names of one slot are taken together.

use std::time::Duration;

use lock_conformance::StoreControl;
use lock_conformance::kit::proxy::Mode;
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_conformance::kit::until;
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{AttemptEach, HolderLabel, Lease, LockBackend, LockName, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::{LONG, cut_and_direct, private, raw, take, unique};

/// One lock request per name, labelled `multi`, in sorted order (as
/// `Locker::acquire_all` asks).
fn requests(backend: &RedisBackend, names: &[&LockName]) -> Vec<LockRequest> {
    let ttl = backend.capabilities().effective_ttl(LONG).unwrap();
    let mut names = names.to_vec();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            LockRequest::new(name.clone(), ttl).with_label(HolderLabel::new("multi").unwrap())
        })
        .collect()
}

/// Every lease of an attempt that must be granted.
async fn granted(backend: &RedisBackend, names: &[&LockName]) -> Vec<Lease> {
    match backend.try_acquire_each(&requests(backend, names)).await {
        Ok(AttemptEach::Acquired(leases)) => leases,
        other => panic!("every one of {names:?} should be granted: {other:?}"),
    }
}

/// The name an attempt that must be refused finds held, and its time left.
async fn refused(backend: &RedisBackend, names: &[&LockName]) -> (LockName, Option<Duration>) {
    match backend.try_acquire_each(&requests(backend, names)).await {
        Ok(AttemptEach::Held { name, expires_in }) => (name, expires_in),
        other => panic!("{names:?} should be refused: {other:?}"),
    }
}

/// Every key of `names`' locks (lock, fence, line, reservation) as the
/// server has them.
async fn lock_keys(con: &redis::aio::MultiplexedConnection, names: &[&LockName]) -> Vec<String> {
    let mut seen = Vec::new();
    for name in names {
        let lock = format!("distlock:{{{name}}}");
        let (value, fence, queue, next): (Option<String>, Option<String>, bool, bool) =
            redis::pipe()
                .get(&lock)
                .get(format!("{lock}:fence"))
                .exists(format!("{lock}:queue"))
                .exists(format!("{lock}:next"))
                .query_async(&mut con.clone())
                .await
                .unwrap();
        seen.push(format!(
            "{lock}={value:?} fence={fence:?} queue={queue} next={next}"
        ));
    }
    seen
}

/// A held name refuses the whole attempt: no other name gets a lock key,
/// a fence, a line or a reservation, and the refusal names the held one
/// with its holder's time left. Once it is free, every name is granted:
/// leases in order, each with its own fence above the name's last, stored
/// with its label and TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_multi_lock_writes_nothing() {
    let url = launcher::shared().url();
    let (backend, other) = (
        RedisBackend::connect(&url).await.unwrap(),
        RedisBackend::connect(&url).await.unwrap(),
    );
    let con = raw(&url).await;
    let (x, y, z) = (unique("each-x"), unique("each-y"), unique("each-z"));
    let names = [&x, &y, &z];
    let before_x = take(&backend, &x, LONG).await;
    backend.release(&before_x).await.unwrap();
    let held = take(&other, &y, LONG).await;
    let before = lock_keys(&con, &names).await;

    let (name, left) = refused(&backend, &names).await;
    assert_eq!(name, y, "the refusal names the held name");
    assert!(left.is_some_and(|l| l > LONG - Duration::from_secs(10) && l <= LONG));
    assert_eq!(lock_keys(&con, &names).await, before, "a refusal wrote");

    other.release(&held).await.unwrap();
    let leases = granted(&backend, &names).await;
    let order: Vec<&LockName> = leases.iter().map(Lease::name).collect();
    assert_eq!(order, [&x, &y, &z], "leases in the requests' order");
    assert!(leases[0].fence() > before_x.fence() && leases[1].fence() > held.fence());
    for lease in &leases {
        let lock = format!("distlock:{{{}}}", lease.name());
        let (value, pttl): (String, u64) = redis::pipe()
            .get(&lock)
            .pttl(&lock)
            .query_async(&mut con.clone())
            .await
            .unwrap();
        let owner = lease.owner().encode();
        assert_eq!(value, format!("{owner}:{} multi", lease.fence()));
        assert!(pttl > LONG.as_millis() as u64 - 10_000, "{pttl} ms left");
        assert_eq!(
            other.inspect(lease.name()).await.unwrap().map(|h| h.fence),
            Some(lease.fence())
        );
    }
    for lease in &leases {
        let released = backend.release(lease).await.unwrap();
        assert_eq!(released, ReleaseOutcome::Released);
    }
}

/// A free name reserved for a woken waiter, or with a waiter in line,
/// counts as held, as for a `try_acquire`: the line's head is woken (the
/// name reserved for it) and nothing else is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_never_barges_past_a_waiter() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = raw(&url).await;
    let (x, y) = (unique("barge-x"), unique("barge-y"));
    let names = [&x, &y];
    let next = format!("distlock:{{{y}}}:next");
    let _: () = con.pset_ex(&next, "someone", 30_000).await.unwrap();
    let (name, left) = refused(&backend, &names).await;
    assert_eq!(name, y, "a reserved name is held");
    assert!(left.is_some_and(|l| l > Duration::from_secs(20) && l <= Duration::from_secs(30)));
    let _: () = con.del(&next).await.unwrap();

    // A waiter whose instance listens on another Cluster node ('c'), so it
    // is trusted to hear its wake-up without a subscriber here.
    let waiter = "1:5000c:distlock:wake:elsewhere";
    let _: () = con
        .zadd(format!("distlock:{{{y}}}:queue"), waiter, 1)
        .await
        .unwrap();
    let (name, left) = refused(&backend, &names).await;
    assert_eq!(name, y, "a name with a waiter in line is held");
    assert!(left.is_some_and(|l| l <= Duration::from_secs(5)));
    let reserved: Option<String> = con.get(&next).await.unwrap();
    assert_eq!(reserved.as_deref(), Some(waiter), "the head was woken");
    assert_eq!(backend.inspect(&x).await.unwrap(), None, "x was granted");

    let _: () = con.del(&next).await.unwrap();
    for lease in granted(&backend, &names).await {
        backend.release(&lease).await.unwrap();
    }
}

/// The reply to a granted multi-lock is lost: the caller gets a retryable
/// error, and each lock the store did grant is freed as soon as the
/// network heals, long before its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_multi_lock_reply_leaves_no_phantom_holder() {
    let store = launcher::shared();
    let (proxy, cut, direct) = cut_and_direct(&store).await;
    let (x, y) = (unique("each-phantom-x"), unique("each-phantom-y"));
    // Load the script first, so the lost request really runs on the server.
    for lease in granted(&cut, &[&x, &y]).await {
        cut.release(&lease).await.unwrap();
    }

    proxy.set(Mode::DropDownstream);
    let outcome = cut.try_acquire_each(&requests(&cut, &[&x, &y])).await;
    assert!(
        matches!(&outcome, Err(e) if e.is_retryable()),
        "a lost reply is a retryable error: {outcome:?}"
    );
    for name in [&x, &y] {
        let phantom = direct.inspect(name).await.unwrap();
        assert!(phantom.is_some(), "the lost attempt ran on the server");
    }

    proxy.set(Mode::Pass);
    let healed = Instant::now();
    until(Duration::from_secs(10), "every phantom freed", || async {
        direct.inspect(&x).await.unwrap().is_none() && direct.inspect(&y).await.unwrap().is_none()
    })
    .await;
    assert!(healed.elapsed() < LONG / 4, "freed long before the TTL");
}

/// With `wait_replicas` and no replica to acknowledge, a multi-lock is
/// not handed out (a retryable error naming the option) and no name is
/// left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_an_unreplicated_multi_lock_is_given_back() {
    let url = launcher::shared().url();
    let config = RedisConfig::from_url(&url).unwrap().wait_replicas(1);
    let lossless = RedisBackend::connect_with(config).await.unwrap();
    let (x, y) = (unique("each-lossless-x"), unique("each-lossless-y"));
    let err = lossless
        .try_acquire_each(&requests(&lossless, &[&x, &y]))
        .await
        .unwrap_err();
    assert!(
        err.is_retryable() && err.to_string().contains("wait_replicas"),
        "{err}"
    );
    for name in [&x, &y] {
        assert_eq!(
            lossless.inspect(name).await.unwrap(),
            None,
            "{name} left held"
        );
    }
}

/// After a restart (a new replication id, taken for a failover), a slot
/// whose grants came from the old server grants nothing for the lock
/// delay: a multi-lock with a name there is refused, naming it, and the
/// other name is not granted either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_waits_out_a_failovers_lock_delay() {
    let store = private(Options::durable()).await;
    let delay = Duration::from_secs(30);
    let connect = || {
        RedisBackend::connect_with(
            RedisConfig::from_url(&store.url())
                .unwrap()
                .failover_lock_delay(delay),
        )
    };
    let (x, y) = (unique("each-delay-x"), unique("each-delay-y"));
    let before = connect().await.unwrap();
    let lease = take(&before, &x, LONG).await;
    before.release(&lease).await.unwrap();
    before.close().await.unwrap();
    store.kill().await.unwrap();
    store.restart().await.unwrap();

    let after = connect().await.unwrap();
    let (name, left) = refused(&after, &[&x, &y]).await;
    assert_eq!(name, x, "the name whose slot saw the old server waits");
    assert!(left.is_some_and(|l| l > delay - Duration::from_secs(10) && l <= delay));
    assert_eq!(after.inspect(&y).await.unwrap(), None, "y was granted");
}

/// On a Redis Cluster no atomic multi-lock is declared: names of several
/// slots are `Unsupported` (a `Locker` takes them one by one), names whose
/// keys share one slot are granted together, or refused together.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_only_names_of_one_slot_go_together() {
    use lock_conformance::kit::stores::redis_cluster;
    use lockcore::{LockError, Locker};
    let cluster = tokio::task::spawn_blocking(redis_cluster::shared)
        .await
        .expect("launcher thread");
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    assert!(!backend.capabilities().atomic_multi);

    // Names by their slot (CLUSTER KEYSLOT): three of one, one of another.
    let base = unique("each-cluster");
    // Scattered suffixes: CRC16 is linear, so names that differ only in a
    // counter's last digits rarely share a slot.
    let candidates: Vec<LockName> = (0_u64..4000)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29))
        .map(|i| LockName::new(format!("{base}/{i:016x}")).unwrap())
        .collect();
    let mut pipe = redis::pipe();
    for name in &candidates {
        pipe.cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("distlock:{{{name}}}"));
    }
    let slots: Vec<u16> = pipe
        .query_async(&mut raw(&cluster.nodes[0].url()).await)
        .await
        .unwrap();
    let of = |slot: u16| {
        candidates
            .iter()
            .zip(&slots)
            .filter(move |(_, s)| **s == slot)
    };
    let shared = *slots
        .iter()
        .find(|&&s| of(s).count() >= 3)
        .expect("a slot of three");
    let mut same: Vec<&LockName> = of(shared).map(|(n, _)| n).take(3).collect();
    same.sort();
    let elsewhere = &candidates[slots.iter().position(|&s| s != shared).unwrap()];

    let apart = backend
        .try_acquire_each(&requests(&backend, &[same[0], elsewhere]))
        .await;
    assert!(
        matches!(
            apart,
            Err(LockError::Unsupported {
                operation: "try_acquire_each",
                ..
            })
        ),
        "{apart:?}"
    );
    let locker = Locker::new(backend.clone()).ttl(LONG);
    let guard = locker.try_acquire_all([same[0], elsewhere]).await.unwrap();
    guard.expect("taken one by one").release().await.unwrap();

    let held = take(&backend, same[1], LONG).await;
    assert_eq!(refused(&backend, &same).await.0, *same[1]);
    assert_eq!(backend.inspect(same[0]).await.unwrap(), None);
    backend.release(&held).await.unwrap();
    let leases = granted(&backend, &same).await;
    assert!(leases[1].fence() > held.fence());
    let renewed = backend.renew_many(&leases).await;
    assert!(renewed.iter().all(Result::is_ok), "{renewed:?}");
    for lease in &leases {
        let released = backend.release(lease).await.unwrap();
        assert_eq!(released, ReleaseOutcome::Released);
    }
}
