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
use lockcore::{LockBackend, LockError, ReleaseOutcome};
use tokio::time::Instant;

/// T3.2: the reply to an acquire is lost. The caller gets a retryable error;
/// the grant the store did make is cleaned up as soon as the network heals,
/// long before its TTL; the client then works again on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_leaves_no_phantom_holder() {
    let store = launcher::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    let cut = RedisBackend::connect_with(via).await.unwrap();
    let direct = RedisBackend::connect(&store.url()).await.unwrap();
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
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let via = RedisConfig::from_url(&store.url())
        .unwrap()
        .address(proxy.addr().ip().to_string(), proxy.addr().port())
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    let cut = RedisBackend::connect_with(via).await.unwrap();
    let direct = RedisBackend::connect(&store.url()).await.unwrap();
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
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}
