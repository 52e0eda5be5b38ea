//! Reaching the server: a lost acquire reply, passwords and ACL users, an
//! unreachable server.

use std::time::Duration;

use crate::support::*;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::redis::{self as launcher, Options};
use lock_conformance::kit::until;
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{Eviction, Persistence, RedisBackend, RedisConfig};
use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, LockBackend, LockError, ReleaseOutcome};
use tokio::time::Instant;

/// T3.2: the reply to an acquire is lost. The caller gets a retryable error;
/// the grant the store did make is cleaned up as soon as the network heals,
/// long before its TTL; the client then works again on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_leaves_no_phantom_holder() {
    let store = launcher::shared();
    let (proxy, cut, direct) = cut_and_direct(&store).await;
    let lock = unique("phantom");
    // Load the scripts first, so the lost request really runs on the server.
    let warm = take(&cut, &lock, LONG).await;
    cut.release(&warm).await.unwrap();

    proxy.set(Mode::DropDownstream);
    let outcome = cut.try_acquire_for(&lock, LONG).await;
    assert!(
        matches!(&outcome, Err(e) if e.is_retryable()),
        "a lost reply is a retryable error: {outcome:?}"
    );
    let fence_key = format!("distlock:{{{}}}:fence", lock.as_str());
    let counter: u64 = raw(&store.url()).await.get(&fence_key).await.unwrap();
    assert!(
        counter > warm.fence().get(),
        "the lost acquire ran on the server"
    );

    proxy.set(Mode::Pass);
    let healed = Instant::now();
    until(
        Duration::from_secs(10),
        "cleanup of the phantom grant",
        || async { direct.inspect(&lock).await.unwrap().is_none() },
    )
    .await;
    assert!(
        healed.elapsed() < LONG / 4,
        "cleaned up long before the TTL"
    );
    let lease = take(&cut, &lock, LONG).await;
    assert!(lease.fence().get() > counter);
    assert_eq!(cut.release(&lease).await.unwrap(), ReleaseOutcome::Released);
}

/// T3.2 for semaphores: the reply to a permit acquire is lost. As for a
/// lock, the caller gets a retryable error, and the permit the store did
/// grant is given back as soon as the network heals, long before its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_reply_leaves_no_phantom_permit() {
    let store = launcher::shared();
    let (proxy, cut, direct) = cut_and_direct(&store).await;
    let semaphore = unique("phantom-permit");
    let request = LockRequest::new(
        semaphore.clone(),
        cut.capabilities().effective_ttl(LONG).unwrap(),
    );
    let acquire = async || cut.try_acquire_permit(&request, 1).await;
    // Load the scripts first, so the lost request really runs on the server.
    let warm = acquire().await.unwrap().into_lease().unwrap();
    cut.release(&warm).await.unwrap();

    proxy.set(Mode::DropDownstream);
    let outcome = acquire().await;
    assert!(
        matches!(&outcome, Err(e) if e.is_retryable()),
        "a lost reply is a retryable error: {outcome:?}"
    );
    let phantom = direct.inspect_permits(&semaphore).await.unwrap();
    assert_eq!(phantom.len(), 1, "the lost acquire ran on the server");

    proxy.set(Mode::Pass);
    let healed = Instant::now();
    until(
        Duration::from_secs(10),
        "the phantom permit given back",
        || async { direct.inspect_permits(&semaphore).await.unwrap().is_empty() },
    )
    .await;
    assert!(
        healed.elapsed() < LONG / 4,
        "given back long before the TTL"
    );
    let lease = acquire().await.unwrap().into_lease().unwrap();
    assert!(lease.fence() > phantom[0].fence);
    assert_eq!(cut.release(&lease).await.unwrap(), ReleaseOutcome::Released);
}

/// A lost acquire reply whose undo's first try fails, for a lock: the undo
/// is retried (for as long as the grant could live), not given up after
/// that try, so a grant the caller never heard of is gone as soon as the
/// server takes writes again, long before its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_undo_whose_first_try_fails_is_retried() {
    undo_retried(Grant::Lock).await;
}

/// The same for a permit: its give-back is retried too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_undo_whose_first_try_fails_is_retried() {
    undo_retried(Grant::Permit).await;
}

#[derive(Clone, Copy, Debug)]
enum Grant {
    Lock,
    Permit,
}

impl Grant {
    async fn attempt(
        self,
        backend: &RedisBackend,
        request: &LockRequest,
    ) -> Result<Attempt, LockError> {
        match self {
            Grant::Lock => backend.try_acquire(request).await,
            Grant::Permit => backend.try_acquire_permit(request, 1).await,
        }
    }
}

/// One grant whose reply is lost, on a private server that then refuses
/// writes for a while: it is made a replica (of a primary nothing listens
/// for, so it keeps its data and serves reads) and refuses every write
/// with `READONLY`, a retryable error. The undo is the only write the
/// client sends meanwhile, so a `READONLY` is a failed try of it.
async fn undo_retried(grant: Grant) {
    let store = private(Options::durable()).await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    // The lost reply times out after this: the server refuses writes
    // before then, so no try of the undo can succeed until it takes them.
    let response_timeout = scaled(Duration::from_secs(1));
    let connect_timeout = scaled(Duration::from_millis(300));
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(response_timeout)
        .connect_timeout(connect_timeout);
    // A try takes at most a connect and its two retries, then the response
    // timeout; tries are at most a second apart (the clean-ups' backoff).
    let next_try = scaled(Duration::from_secs(1)) + connect_timeout * 3 + response_timeout;
    let cut = RedisBackend::connect_with(via).await.unwrap();
    let name = unique("undo");
    let request = LockRequest::new(
        name.clone(),
        cut.capabilities().effective_ttl(LONG).unwrap(),
    );
    // Load the script first, so the lost request really runs on the server.
    let warm = grant.attempt(&cut, &request).await.unwrap();
    let warm = warm.into_lease().unwrap();
    cut.release(&warm).await.unwrap();

    let observer = raw(&store.url()).await;
    let granted = async || -> bool {
        let mut con = observer.clone();
        match grant {
            Grant::Lock => con.exists(format!("distlock:{{{}}}", name.as_str())),
            Grant::Permit => con.exists(format!("distlock:{{{}}}:permits", name.as_str())),
        }
        .await
        .unwrap()
    };
    // Writes the server refused.
    let refused = async || {
        let info: String = redis::cmd("INFO")
            .arg("errorstats")
            .query_async(&mut observer.clone())
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("errorstat_READONLY:count="))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    let refused_before = refused().await;
    proxy.set(Mode::DropDownstream);
    let sent = Instant::now();
    let lost = tokio::spawn({
        let (cut, request) = (cut.clone(), request.clone());
        async move { grant.attempt(&cut, &request).await }
    });
    until(response_timeout, "the request runs on the server", granted).await;
    let mut admin = observer.clone();
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        sent.elapsed() < response_timeout,
        "the server refused writes only after the lost reply timed out"
    );
    let lost = lost.await.unwrap();
    assert!(matches!(&lost, Err(e) if e.is_retryable()), "{lost:?}");
    proxy.set(Mode::Pass);
    // The first try may fail before it reaches the server (its connect ran
    // while replies were dropped); the second reaches it.
    until(next_try * 2, "a try of the undo refused", || async {
        refused().await > refused_before
    })
    .await;

    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let writable = Instant::now();
    until(
        next_try,
        &format!("the {grant:?} undone once the server takes writes"),
        || async { !granted().await },
    )
    .await;
    assert!(writable.elapsed() < LONG / 4, "undone long before the TTL");
}

/// T4.11: passwords and ACL users. Wrong credentials are a permanent error,
/// never shown; a user limited to its prefix locks there and nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_acl_users() {
    let store = private(Options::durable()).await;
    let addr = store.addr();
    let mut con = raw(&store.url()).await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(">locker-pw-123")
        .arg("~app:*")
        .arg("&app:*")
        .arg("+@all")
        .arg("-@dangerous")
        .arg("+info")
        .query_async(&mut con)
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("admin-pw-456")
        .query_async(&mut con)
        .await
        .unwrap();

    for (url, what) in [
        (format!("redis://{addr}"), "no password"),
        (format!("redis://:wrong-pw-789@{addr}"), "wrong password"),
        (
            format!("redis://locker:wrong-pw-789@{addr}"),
            "wrong user password",
        ),
    ] {
        let err = RedisBackend::connect(&url).await.unwrap_err();
        assert!(matches!(err, LockError::Store { .. }), "{what}: {err:?}");
        assert!(!err.is_retryable(), "{what}");
        assert!(
            !format!("{err} {err:?}").contains("wrong-pw-789"),
            "{what}: {err:?}"
        );
    }

    let admin = RedisBackend::connect(&format!("redis://:admin-pw-456@{addr}"))
        .await
        .unwrap();
    assert!(!format!("{admin:?}").contains("admin-pw-456"));
    assert_eq!(admin.persistence(), &Persistence::AofAlways);

    let user_url = format!("redis://locker:locker-pw-123@{addr}");
    let config = RedisConfig::from_url(&user_url).unwrap().key_prefix("app:");
    assert!(!format!("{config:?}").contains("locker-pw-123"));
    let user = RedisBackend::connect_with(config).await.unwrap();
    assert!(
        matches!(user.persistence(), Persistence::Unknown(_)),
        "CONFIG is denied to this user: {:?}",
        user.persistence()
    );
    assert_eq!(
        user.eviction(),
        &Eviction::Unlimited,
        "INFO tells this user the server evicts nothing"
    );
    let lock = unique("acl");
    let lease = take(&user, &lock, LONG).await;
    // Waiting needs the user's own channel (`&app:*`) and line keys.
    let waiter = patient(
        RedisBackend::connect_with(RedisConfig::from_url(&user_url).unwrap().key_prefix("app:"))
            .await
            .unwrap(),
    );
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { waiter.acquire(&lock).await }
    });
    until(Duration::from_secs(10), "the user's waiter in line", || {
        let (mut con, key) = (con.clone(), format!("app:{{{}}}:queue", lock.as_str()));
        async move { con.zcard::<_, usize>(key).await.unwrap() == 1 }
    })
    .await;
    assert_eq!(
        user.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    let woken = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the store, not the 60 s re-check")
        .unwrap()
        .unwrap();
    woken.release().await.unwrap();

    let outside = RedisBackend::connect_with(
        RedisConfig::from_url(&user_url)
            .unwrap()
            .key_prefix("other:"),
    )
    .await
    .unwrap();
    let denied = outside.try_acquire_for(&lock, LONG).await;
    assert!(matches!(denied, Err(LockError::Store { .. })), "{denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_prompt_retryable_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = RedisConfig::from_url(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = RedisBackend::connect_with(config).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        started.elapsed() < scaled(Duration::from_secs(3)),
        "took {:?}",
        started.elapsed()
    );
}
