//! A server that may evict keys when memory runs short (`maxmemory` with
//! any policy but `noeviction`) is refused at connect, with the fix in the
//! message; the opt-in connects, says what it costs in `capabilities()`,
//! and the expected-violation test shows the hazard it accepts.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::support::{private, raw, unique};
use lock_conformance::kit::stores::redis::{Options, Persistence};
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{Eviction, FENCE_ASSUMPTION, RedisBackend, RedisConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, FenceDurability, LockBackend, LockError, Locker};
use lockcore::{Fenced, StaleToken};

const LIMIT: &str = "2mb";
const LIMIT_BYTES: u64 = 2 * 1024 * 1024;
const LONG: Duration = Duration::from_secs(120);

/// A private server with a 2 MB limit and `policy`, no persistence (so
/// that memory is data, not AOF buffers).
async fn limited(policy: &str) -> lock_conformance::kit::stores::Store {
    log();
    private(
        Options::default()
            .persistence(Persistence::None)
            .server_args(["--maxmemory", LIMIT, "--maxmemory-policy", policy]),
    )
    .await
}

async fn used_memory(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO memory reports used_memory")
}

/// Writes 8 KB values without a TTL under `filler:` until the server uses
/// `up_to` bytes (keys with a TTL are all Redis may evict meanwhile).
async fn fill(con: &mut redis::aio::MultiplexedConnection, up_to: u64) -> usize {
    let value = vec![b'x'; 8 * 1024];
    let mut written = 0;
    while used_memory(con).await < up_to {
        let () = con.set(format!("filler:{written}"), &value).await.unwrap();
        written += 1;
    }
    written
}

/// Every warning this test binary logs, as text.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The binary's log, recorded by a global subscriber installed on first
/// use (a thread-local one can miss events whose callsite another test's
/// thread registered first).
fn log() -> &'static Log {
    static LOG: OnceLock<Log> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Log::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        log
    })
}

/// Runs `connect`; its outcome, and the warnings about `endpoint` logged
/// meanwhile (tests run in parallel, each on its own server).
async fn warnings_of<T>(
    endpoint: &str,
    connect: impl std::future::Future<Output = T>,
) -> (T, Vec<String>) {
    let from = log().0.lock().unwrap().len();
    let outcome = connect.await;
    let text = String::from_utf8(log().0.lock().unwrap()[from..].to_vec()).unwrap();
    let about = |line: &&str| line.contains(&format!("endpoint={endpoint} "));
    (
        outcome,
        text.lines().filter(about).map(str::to_owned).collect(),
    )
}

fn connect_allowing(url: &str) -> RedisConfig {
    RedisConfig::from_url(url)
        .unwrap()
        .allow_maxmemory_eviction(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_policy_is_refused_with_the_fix() {
    let store = limited("volatile-ttl").await;
    let url = store.url();
    let mut con = raw(&url).await;
    fill(&mut con, LIMIT_BYTES * 3 / 4).await;

    let err = RedisBackend::connect(&url).await.unwrap_err();
    let LockError::InvalidConfig { message, .. } = &err else {
        panic!("an evicting policy must be a config error: {err:?}");
    };
    for needed in [
        "maxmemory-policy volatile-ttl",
        "every held lock key has one",
        "CONFIG SET maxmemory-policy noeviction",
        "CONFIG SET maxmemory 0",
        "allow_maxmemory_eviction",
    ] {
        assert!(
            message.contains(needed),
            "{needed:?} missing from: {message}"
        );
    }

    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut con)
        .await
        .unwrap();
    let err = RedisBackend::connect(&url).await.unwrap_err();
    assert!(
        err.to_string().contains("allkeys-lru") && err.to_string().contains("fence keys"),
        "{err}"
    );

    // Either fix from the message works.
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut con)
        .await
        .unwrap();
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(
        backend.eviction(),
        &Eviction::Refuses {
            maxmemory: LIMIT_BYTES
        }
    );
    assert_eq!(
        backend.capabilities().fence_durability,
        FenceDurability::Conditional(FENCE_ASSUMPTION)
    );
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut con)
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut con)
        .await
        .unwrap();
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(backend.eviction(), &Eviction::Unlimited);
}

/// The opt-in, by builder or URL: connects, reports the policy, and
/// `capabilities()` names it and what it costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_opt_in_connects_and_downgrades_what_is_promised() {
    let store = limited("volatile-ttl").await;
    let url = store.url();
    for (backend, warnings) in [
        warnings_of(&url, RedisBackend::connect_with(connect_allowing(&url))).await,
        warnings_of(
            &url,
            RedisBackend::connect(&format!("{url}?allow_maxmemory_eviction=true")),
        )
        .await,
    ] {
        let backend = backend.unwrap();
        let about_eviction: Vec<_> = warnings
            .iter()
            .filter(|w| w.contains("maxmemory"))
            .collect();
        assert_eq!(about_eviction.len(), 1, "one warning: {warnings:?}");
        assert!(
            about_eviction[0].contains("WARN") && about_eviction[0].contains("volatile-ttl"),
            "{warnings:?}"
        );
        assert_eq!(
            backend.eviction(),
            &Eviction::Evicts {
                maxmemory: LIMIT_BYTES,
                policy: "volatile-ttl".into()
            }
        );
        let FenceDurability::Conditional(why) = backend.capabilities().fence_durability else {
            panic!("redis fences are conditional");
        };
        assert!(why.starts_with("maxmemory-policy volatile-ttl "), "{why}");
        assert!(why.contains("a second client can be granted a lock that is still held"));
    }
    let off = RedisBackend::connect(&format!("{url}?allow_maxmemory_eviction=false")).await;
    assert!(
        matches!(off, Err(LockError::InvalidConfig { .. })),
        "{off:?}"
    );
}

/// Creates ACL user `name` with password `locker-pw` on the prefix
/// `distlock:` with `rules` (`-@dangerous` denies `CONFIG` and `INFO`).
async fn acl_user(con: &mut redis::aio::MultiplexedConnection, name: &str, rules: &[&str]) {
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg(&["reset", "on", ">locker-pw", "~distlock:*", "&distlock:*"])
        .arg(rules)
        .query_async(con)
        .await
        .unwrap();
}

/// The README's least-privilege user (`+@all -@dangerous +info`) may not
/// run `CONFIG GET`, but reads the policy from `INFO memory`: an evicting
/// server is refused for it as for anyone, and the opt-in names the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_user_reads_the_policy_from_info() {
    let store = limited("volatile-ttl").await;
    let mut con = raw(&store.url()).await;
    acl_user(&mut con, "locker", &["+@all", "-@dangerous", "+info"]).await;
    let url = format!("redis://locker:locker-pw@{}", store.addr());
    let err = RedisBackend::connect(&url).await.unwrap_err();
    let LockError::InvalidConfig { message, .. } = &err else {
        panic!("an evicting policy must be a config error: {err:?}");
    };
    assert!(
        message.contains("maxmemory-policy volatile-ttl"),
        "{message}"
    );
    let user = RedisBackend::connect_with(connect_allowing(&url))
        .await
        .unwrap();
    assert_eq!(
        user.eviction(),
        &Eviction::Evicts {
            maxmemory: LIMIT_BYTES,
            policy: "volatile-ttl".into()
        }
    );
}

/// A user that may read neither `CONFIG` nor `INFO` cannot tell whether the
/// server evicts held locks: refused, saying what to grant and how to opt
/// in; with the opt-in it connects, warns, and `capabilities()` says the
/// policy is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_nobody_may_read_is_refused_unless_accepted() {
    let store = limited("volatile-ttl").await;
    let mut con = raw(&store.url()).await;
    acl_user(&mut con, "blind", &["+@all", "-@dangerous"]).await;
    let url = format!("redis://blind:locker-pw@{}", store.addr());
    let err = RedisBackend::connect(&url).await.unwrap_err();
    let LockError::InvalidConfig { message, .. } = &err else {
        panic!("a policy that cannot be read must be a config error: {err:?}");
    };
    for needed in ["could not read", "+info", "allow_maxmemory_eviction"] {
        assert!(
            message.contains(needed),
            "{needed:?} missing from: {message}"
        );
    }
    let (user, warnings) = warnings_of(
        &store.url(),
        RedisBackend::connect_with(connect_allowing(&url)),
    )
    .await;
    let user = user.expect("the opt-in accepts a policy that cannot be read");
    assert!(
        warnings.iter().any(|w| w.contains("could not read")),
        "it says it could not check: {warnings:?}"
    );
    assert!(
        matches!(user.eviction(), Eviction::Unknown(why) if why.contains("info")),
        "{:?}",
        user.eviction()
    );
    let FenceDurability::Conditional(why) = user.capabilities().fence_durability else {
        panic!("redis fences are conditional");
    };
    assert!(why.starts_with("maxmemory-policy unknown"), "{why}");
}

/// EXPECTED VIOLATION, the hazard `allow_maxmemory_eviction` accepts:
/// under `volatile-ttl` a held lock's key (it has a TTL; the data here has
/// none) is the first thing Redis evicts when memory runs out. A second
/// client is then granted the lock while the first still holds a valid
/// lease: two holders at once (S1 broken). What still holds is fencing:
/// the fence counter has no TTL and survives, so the second grant's fence
/// is larger, and a resource that checks fences refuses the first
/// holder's write. The first holder learns at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_violation_an_evicted_lock_key_gives_two_holders() {
    let store = limited("volatile-ttl").await;
    let url = store.url();
    let mut con = raw(&url).await;
    let first = Locker::new(
        RedisBackend::connect_with(connect_allowing(&url))
            .await
            .unwrap(),
    )
    .ttl(LONG);
    let second = RedisBackend::connect_with(connect_allowing(&url))
        .await
        .unwrap();
    let name = unique("evicted-by-memory");
    let lock_key = format!("distlock:{{{}}}", name.as_str());
    let guard = first.acquire(&name).await.unwrap();

    // Memory runs out: Redis makes room by evicting the lock key (and
    // refuses the write that found nothing more to evict).
    let value = vec![b'x'; 8 * 1024];
    let mut filled = 0;
    for attempt in 0.. {
        if !con.exists::<_, bool>(&lock_key).await.unwrap() {
            break;
        }
        assert!(attempt < 10_000, "the lock key was never evicted");
        match con
            .set::<_, _, ()>(format!("filler:{filled}"), &value)
            .await
        {
            Ok(()) => filled += 1,
            Err(e) if e.code() == Some("OOM") => {}
            Err(e) => panic!("filling: {e}"),
        }
    }
    assert!(filled > 0);
    let fence_key = format!("{lock_key}:fence");
    let counter: Option<u64> = con.get(&fence_key).await.unwrap();
    assert_eq!(
        counter,
        Some(guard.fencing_token().get()),
        "the fence counter has no TTL: volatile-ttl leaves it alone"
    );
    // Some memory comes back; the name looks free.
    let fillers: Vec<String> = (0..filled).map(|i| format!("filler:{i}")).collect();
    let () = con.del(&fillers).await.unwrap();
    let lease = match second.try_acquire_for(&name, LONG).await.unwrap() {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("the evicted lock should look free"),
    };
    assert!(
        guard.is_held(),
        "the violation: the first holder's lease is still valid while a second holder was granted"
    );
    assert!(lease.fence() > guard.fencing_token(), "fences still grow");

    // Fencing is what still protects a resource: the older holder's write is refused.
    let write = |v: &str| redis::cmd("SET").arg("{order:1}").arg(v).clone();
    let applied: Fenced<String> = second
        .fenced_write("{order:1}:fence", lease.fence(), &write("second"))
        .await
        .unwrap();
    assert!(applied.is_ok());
    let stale: Fenced<String> = second
        .fenced_write("{order:1}:fence", guard.fencing_token(), &write("first"))
        .await
        .unwrap();
    assert_eq!(
        stale,
        Err(StaleToken {
            token: guard.fencing_token(),
            highest: lease.fence()
        })
    );
    // And the first holder's next renewal is refused.
    assert!(matches!(
        second.renew(&guard.lease()).await,
        Err(LockError::NotHeld { .. })
    ));
}

/// What the fix buys: a full `noeviction` server drops nothing. It
/// refuses new grants with a retryable error that says why (memory can
/// come back); held locks keep their keys and fences, renew and release as
/// usual (those scripts add nothing to memory); grants resume once there
/// is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_noeviction_server_drops_nothing() {
    let store = limited("noeviction").await;
    let url = store.url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let (name, new) = (unique("held"), unique("new"));
    let held = match backend.try_acquire_for(&name, LONG).await.unwrap() {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => unreachable!("a fresh name is free"),
    };
    let mut con = raw(&url).await;
    let set_limit = |bytes: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .clone()
    };
    // Full: the limit is now below what the server uses.
    let () = set_limit("1").query_async(&mut con).await.unwrap();

    let refused = backend.try_acquire_for(&new, LONG).await.unwrap_err();
    assert!(refused.is_retryable(), "memory can come back: {refused:?}");
    assert!(refused.to_string().contains("OOM"), "{refused}");
    let renewed = backend.renew(&held).await.expect("the holder renews");
    assert_eq!(
        backend.inspect(&name).await.unwrap().map(|h| h.fence),
        Some(held.fence()),
        "the held lock stays"
    );
    assert_eq!(
        backend.release(&renewed).await.unwrap(),
        lockcore::ReleaseOutcome::Released
    );

    let () = set_limit(LIMIT).query_async(&mut con).await.unwrap();
    let granted = backend.try_acquire_for(&new, LONG).await.unwrap();
    assert!(matches!(granted, Attempt::Acquired(_)), "{granted:?}");
}
