//! The whole conformance suite against a real `redis-server` launched by the
//! suite's harness (durable: AOF with `appendfsync always`, the configuration
//! the crate docs recommend), or the server `LOCK_TEST_REDIS_URL` names.
//! Crash cases get a private server of their own; fault cases connect
//! through the harness's fault proxy.

use lock_redis::RedisBackend;

lock_conformance::suite!(
    lock_conformance::StoreFactory::redis(|url| async move { RedisBackend::connect(&url).await }),
    // redis-server hangs under libfaketime: its clock cannot be stepped here.
    expect_skips = [server_clock_steps_are_judged_on_the_server,],
);
