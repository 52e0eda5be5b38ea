//! Redis Cluster (feature `cluster`), against private Clusters the kit
//! launches: the URL must match what the server is, and a slot that moves
//! to another primary while its lock is held and waited on loses nothing,
//! grants nothing twice, and its fences keep growing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_conformance::kit::stores::redis_cluster::{self, RedisCluster};
use lock_conformance::kit::until;
use lock_redis::RedisBackend;
use lockcore::{LockError, Locker};

use lock_redis::redis;

use lockcore::LockBackend;

use super::support::{command_calls, raw, scaled, take, unique};

/// A private three-primary Cluster of this test.
async fn private_cluster() -> RedisCluster {
    tokio::task::spawn_blocking(redis_cluster::start)
        .await
        .expect("launcher thread")
        .expect("redis-server and redis-cli must be installed (apt-get install redis-server redis-tools)")
}

/// `redis-cli` on node `node` of `cluster`, off the runtime's worker.
pub(super) async fn cli(cluster: &Arc<RedisCluster>, node: usize, args: &[&str]) -> String {
    let (cluster, args) = (
        cluster.clone(),
        args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>(),
    );
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cluster.cli(node, &args)
    })
    .await
    .expect("redis-cli thread")
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The index of the node that owns `slot` now, as node 0 sees it.
pub(super) async fn owner(cluster: &Arc<RedisCluster>, slot: u16) -> usize {
    owner_seen_by(cluster, slot, 0).await
}

/// The index of the node that owns `slot` now, as node `by` sees it.
pub(super) async fn owner_seen_by(cluster: &Arc<RedisCluster>, slot: u16, by: usize) -> usize {
    let nodes = cli(cluster, by, &["cluster", "nodes"]).await;
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let owns = fields.iter().skip(8).any(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
        });
        if owns {
            let port: u16 = fields[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok())
                .expect("a node address");
            return cluster
                .nodes
                .iter()
                .position(|n| n.addr().port() == port)
                .expect("a node of this Cluster");
        }
    }
    panic!("no node owns slot {slot}:\n{nodes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn urls_must_say_what_the_server_is() {
    let cluster = private_cluster().await;
    let node = cluster.nodes[0].url();
    match RedisBackend::connect(&node).await {
        Err(LockError::InvalidConfig { message, .. }) => {
            assert!(message.contains("redis+cluster://"), "{message}");
        }
        other => panic!("a redis:// URL to a Cluster node must be refused: {other:?}"),
    }
    let plain = super::support::private(Default::default()).await;
    let as_cluster = plain.url().replace("redis://", "redis+cluster://");
    match RedisBackend::connect(&as_cluster).await {
        Err(LockError::InvalidConfig { message, .. }) => {
            assert!(message.contains("not a Redis Cluster node"), "{message}");
        }
        other => panic!("a Cluster URL to a plain server must be refused: {other:?}"),
    }
    RedisBackend::connect(&cluster.url())
        .await
        .expect("the Cluster URL connects");
}

/// A lock's slot moves to another primary (`CLUSTER SETSLOT ... IMPORTING`
/// / `MIGRATING`, `MIGRATE` key by key, `SETSLOT ... NODE`) while a holder
/// renews it and three waiters wait in line. The holder keeps it (its
/// renewals follow the keys, through `ASK` and then `MOVED`), the waiters
/// are served one at a time in their order once it is released, and every
/// fence is above the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moving_to_another_primary_keeps_every_lock() {
    let cluster = Arc::new(private_cluster().await);
    let url = cluster.url();
    let name = unique("reshard");
    let lock_key = format!("distlock:{{{name}}}");
    let slot: u16 = cli(&cluster, 0, &["cluster", "keyslot", &lock_key])
        .await
        .trim()
        .parse()
        .expect("a slot");
    let from = owner(&cluster, slot).await;
    let to = (from + 1) % cluster.nodes.len();
    // TTLs short enough that the holder renews during the move.
    let ttl = scaled(Duration::from_secs(3));
    let holder = Locker::new(RedisBackend::connect(&url).await.unwrap()).ttl(ttl);
    let guard = holder.acquire(&name).await.unwrap();
    let first_fence = guard.fencing_token();

    const WAITERS: usize = 3;
    let inside = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
    let queue_key = format!("{lock_key}:queue");
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let locker = Locker::new(RedisBackend::connect(&url).await.unwrap())
            .ttl(ttl)
            .max_wait(scaled(Duration::from_secs(60)));
        let (name, inside, grants) = (name.clone(), inside.clone(), grants.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locker.acquire(&name).await?;
            assert!(
                !inside.swap(true, Ordering::SeqCst),
                "waiter {i} was granted the lock while another held it"
            );
            grants.lock().unwrap().push((i, guard.fencing_token()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            inside.store(false, Ordering::SeqCst);
            guard.release().await?;
            Ok::<_, LockError>(())
        }));
        // Each in line before the next comes: their order is defined.
        let joined = (i + 1).to_string();
        until(
            scaled(Duration::from_secs(10)),
            "the waiter joins the line",
            || {
                let (cluster, queue_key, joined) =
                    (cluster.clone(), queue_key.clone(), joined.clone());
                async move {
                    let node = owner(&cluster, slot).await;
                    cli(&cluster, node, &["zcard", &queue_key]).await.trim() == joined
                }
            },
        )
        .await;
    }

    // Move the slot, key by key; after the lock key moved, a renewal must
    // find it on the new primary (through ASK) before the rest follows.
    let from_id = cli(&cluster, from, &["cluster", "myid"])
        .await
        .trim()
        .to_owned();
    let to_id = cli(&cluster, to, &["cluster", "myid"])
        .await
        .trim()
        .to_owned();
    let to_port = cluster.nodes[to].addr().port().to_string();
    let slot_text = slot.to_string();
    cli(
        &cluster,
        to,
        &["cluster", "setslot", &slot_text, "importing", &from_id],
    )
    .await;
    cli(
        &cluster,
        from,
        &["cluster", "setslot", &slot_text, "migrating", &to_id],
    )
    .await;
    let migrate = |key: String| {
        let (cluster, to_port) = (cluster.clone(), to_port.clone());
        async move {
            cli(
                &cluster,
                from,
                &["migrate", "127.0.0.1", &to_port, &key, "0", "5000"],
            )
            .await;
        }
    };
    migrate(lock_key.clone()).await;
    // The importing primary answers for the slot only after ASKING.
    let importer = raw(&cluster.nodes[to].url()).await;
    let pttl = |key: String| {
        let mut con = importer.clone();
        async move {
            let (pttl,): (i64,) = redis::pipe()
                .cmd("ASKING")
                .ignore()
                .cmd("PTTL")
                .arg(&key)
                .query_async(&mut con)
                .await
                .expect("PTTL on the importing primary");
            pttl
        }
    };
    let moved_at_pttl = pttl(lock_key.clone()).await;
    assert!(moved_at_pttl > 0, "the held lock's key moved with its TTL");
    until(ttl, "the holder renews the lock on its new primary", || {
        let checking = pttl(lock_key.clone());
        async move { checking.await > moved_at_pttl }
    })
    .await;
    loop {
        let keys = cli(
            &cluster,
            from,
            &["cluster", "getkeysinslot", &slot_text, "100"],
        )
        .await;
        let keys: Vec<String> = keys
            .lines()
            .map(str::to_owned)
            .filter(|k| !k.is_empty())
            .collect();
        if keys.is_empty() {
            break;
        }
        for key in keys {
            migrate(key).await;
        }
    }
    for node in 0..cluster.nodes.len() {
        cli(
            &cluster,
            node,
            &["cluster", "setslot", &slot_text, "node", &to_id],
        )
        .await;
    }
    assert_eq!(owner(&cluster, slot).await, to, "the slot moved");

    // The holder kept the lock through the move, renewing on the new primary.
    assert!(
        guard.is_held(),
        "the holder lost the lock: {:?}",
        guard.loss_reason()
    );
    let held = cli(&cluster, to, &["get", &lock_key]).await;
    assert!(
        held.contains(&format!(":{first_fence}")),
        "the lock key on the new primary holds the holder's grant: {held}"
    );
    // Renewals keep going after the move, on the new primary.
    let after_move = pttl(lock_key.clone()).await;
    until(ttl, "the holder renews after the move", || {
        let checking = pttl(lock_key.clone());
        async move { checking.await > after_move }
    })
    .await;
    assert!(
        guard.is_held(),
        "the holder lost the lock after the move: {:?}",
        guard.loss_reason()
    );
    guard.release().await.unwrap();

    for waiter in waiters {
        waiter
            .await
            .expect("waiter task")
            .expect("every waiter is served");
    }
    let grants = grants.lock().unwrap().clone();
    let order: Vec<usize> = grants.iter().map(|g| g.0).collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "served in line order"
    );
    let mut last = first_fence;
    for (i, fence) in &grants {
        assert!(
            *fence > last,
            "waiter {i}'s fence {fence} is not above {last}"
        );
        last = *fence;
    }
    // A grant after the move still lands above every fence before it.
    let again = holder.acquire(&name).await.unwrap();
    assert!(again.fencing_token() > last);
    again.release().await.unwrap();
}

/// Scripts run on all of `cluster`'s nodes (EVALSHA, plus EVAL after a
/// NOSCRIPT).
async fn scripts_run(cluster: &RedisCluster) -> u64 {
    let mut total = 0;
    for node in &cluster.nodes {
        let con = raw(&node.url()).await;
        total += command_calls(&con, "evalsha").await + command_calls(&con, "eval").await;
    }
    total
}

/// `renew_many` of 300 locks and permits of as many names (spread over
/// every primary's slots) runs one script per primary, not one per slot;
/// after a slot moved, its leases are renewed by their slot and the rest
/// still by primary, every lease judged on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_many_runs_one_script_per_primary() {
    const LEASES: usize = 300;
    let cluster = Arc::new(private_cluster().await);
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    let base = unique("renew-many");
    let ttl = scaled(Duration::from_secs(30));
    let mut leases = Vec::new();
    for i in 0..LEASES {
        let name = lockcore::LockName::new(format!("{base}/{i}")).unwrap();
        leases.push(take(&backend, &name, ttl).await);
    }
    // One more whose lock is gone: judged on its own, not held.
    let gone = take(&backend, &unique("renew-many-gone"), ttl).await;
    backend.release(&gone).await.unwrap();
    leases.push(gone);
    // The first call reads the slot owners and may load the script.
    backend.renew_many(&leases).await;
    let before = scripts_run(&cluster).await;
    let renewed = backend.renew_many(&leases).await;
    let scripts = scripts_run(&cluster).await - before;
    assert!(renewed[..LEASES].iter().all(Result::is_ok), "{renewed:?}");
    assert!(matches!(renewed[LEASES], Err(LockError::NotHeld { .. })));
    assert!(
        scripts <= cluster.nodes.len() as u64,
        "{scripts} scripts renewed {} leases on {} primaries",
        leases.len(),
        cluster.nodes.len()
    );

    // Move the slot of the first lease to another primary.
    let lock_key = format!("distlock:{{{}}}", leases[0].name());
    let slot: u16 = cli(&cluster, 0, &["cluster", "keyslot", &lock_key])
        .await
        .trim()
        .parse()
        .unwrap();
    let from = owner(&cluster, slot).await;
    let to = (from + 1) % cluster.nodes.len();
    let to_id = cli(&cluster, to, &["cluster", "myid"])
        .await
        .trim()
        .to_owned();
    let from_id = cli(&cluster, from, &["cluster", "myid"])
        .await
        .trim()
        .to_owned();
    let slot_text = slot.to_string();
    let to_port = cluster.nodes[to].addr().port().to_string();
    cli(
        &cluster,
        to,
        &["cluster", "setslot", &slot_text, "importing", &from_id],
    )
    .await;
    cli(
        &cluster,
        from,
        &["cluster", "setslot", &slot_text, "migrating", &to_id],
    )
    .await;
    loop {
        let keys = cli(
            &cluster,
            from,
            &["cluster", "getkeysinslot", &slot_text, "100"],
        )
        .await;
        let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        if keys.is_empty() {
            break;
        }
        for key in keys {
            cli(
                &cluster,
                from,
                &["migrate", "127.0.0.1", &to_port, key, "0", "5000"],
            )
            .await;
        }
    }
    for node in 0..cluster.nodes.len() {
        cli(
            &cluster,
            node,
            &["cluster", "setslot", &slot_text, "node", &to_id],
        )
        .await;
    }
    let renewed = backend.renew_many(&leases).await;
    assert!(renewed[..LEASES].iter().all(Result::is_ok), "{renewed:?}");
    assert!(matches!(renewed[LEASES], Err(LockError::NotHeld { .. })));
    let held = cli(&cluster, to, &["pttl", &lock_key]).await;
    assert!(
        held.trim().parse::<i64>().unwrap() > 0,
        "the moved lock is held on its new primary"
    );
}

/// `raise_fence_floor` raises the floor keys of all 16,384 slots with a
/// few scripts per primary (4,096 keys each), and every later grant, of
/// names on every primary, is above the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fence_floor_is_raised_with_a_few_scripts_per_primary() {
    let cluster = Arc::new(private_cluster().await);
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    let floor = lockcore::FencingToken::new(1 << 52).unwrap();
    backend.raise_fence_floor(floor).await.unwrap(); // may load the script
    let before = scripts_run(&cluster).await;
    let higher = lockcore::FencingToken::new((1 << 52) + 1000).unwrap();
    backend.raise_fence_floor(higher).await.unwrap();
    let scripts = scripts_run(&cluster).await - before;
    let per_primary = 16_384_u64
        .div_ceil(cluster.nodes.len() as u64)
        .div_ceil(4096);
    assert!(
        scripts <= per_primary * cluster.nodes.len() as u64,
        "{scripts} scripts raised the floor"
    );
    let base = unique("floor");
    for i in 0..30 {
        let name = lockcore::LockName::new(format!("{base}/{i}")).unwrap();
        let lease = take(&backend, &name, scaled(Duration::from_secs(30))).await;
        assert!(
            lease.fence() > higher,
            "{name}: {} <= {higher}",
            lease.fence()
        );
    }
}

/// `rediss+cluster://`: a Cluster serving TLS only (its bus too), trusted
/// through `tls_ca`; locks, waits and per-primary renewals work across its
/// nodes, and a client that does not trust its CA is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_cluster_locks_with_a_private_ca() {
    let ca = lock_conformance::kit::pki::TestCa::new("cluster-ca");
    let server = ca.server();
    let tls = lock_conformance::kit::stores::redis::Tls::new(server.cert, server.key, ca.pem());
    let options = lock_conformance::kit::stores::redis::Options::durable().tls(tls);
    let cluster = tokio::task::spawn_blocking(move || redis_cluster::start_with(options))
        .await
        .expect("launcher thread")
        .expect("a TLS Redis Cluster");
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let a = RedisBackend::connect(&url).await.unwrap();
    let b = RedisBackend::connect(&url).await.unwrap();
    let base = unique("tls-cluster");
    let ttl = scaled(Duration::from_secs(30));
    let mut leases = Vec::new();
    for i in 0..20 {
        let name = lockcore::LockName::new(format!("{base}/{i}")).unwrap();
        leases.push(take(&a, &name, ttl).await);
    }
    assert!(a.renew_many(&leases).await.iter().all(Result::is_ok));
    let name = leases[0].name().clone();
    let waiting = tokio::spawn(async move {
        Locker::new(b)
            .ttl(ttl)
            .max_wait(scaled(Duration::from_secs(20)))
            .acquire(&name)
            .await
    });
    a.release(&leases[0]).await.unwrap();
    let guard = waiting
        .await
        .unwrap()
        .expect("the waiter is handed the lock");
    assert!(guard.fencing_token() > leases[0].fence());
    let untrusted = url.split('?').next().unwrap().to_owned();
    assert!(
        RedisBackend::connect(&untrusted).await.is_err(),
        "a client without the CA must be refused"
    );
}
