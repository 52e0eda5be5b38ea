//! The whole conformance suite against a Redis Cluster the suite's kit
//! launches (three primaries, each durable: AOF with `appendfsync always`),
//! or the one `LOCK_TEST_REDIS_CLUSTER_URL` names. Needs the `cluster`
//! feature. The fault cases put a proxy in front of every node, and the
//! client reaches each node through its proxy (the URL's `node_map`).
#![cfg(feature = "cluster")]

use lock_redis::RedisBackend;

lock_conformance::suite!(
    lock_conformance::redis_cluster(|url| async move { RedisBackend::connect(&url).await }),
    expect_skips = [
        // redis-server hangs under libfaketime: its clock cannot be stepped here.
        server_clock_steps_are_judged_on_the_server,
        // One script reaches one slot, and the case's names (like most
        // names) land in different slots: on a Cluster a multi-lock takes
        // its names one by one, so atomic_multi is not declared.
        multi_lock_waits_holding_nothing,
    ],
);
