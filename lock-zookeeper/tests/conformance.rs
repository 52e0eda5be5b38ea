//! The whole conformance suite against a real ZooKeeper launched by the
//! harness (or the one `LOCK_TEST_ZOOKEEPER_URL` names), including the fault
//! cases: a proxy in front of the shared server, and private servers to kill
//! and pause.

#[path = "store/support.rs"]
mod support;

lock_conformance::suite!(
    support::factory(),
    expect_skips = [
        // Leases are the session (`LeaseKind::Session`): a lock or permit
        // expires when its holder's session does, which the fault cases
        // cover (kill -9, partitions, a paused holder), not at a TTL of its
        // own on the server. (Only `set_remaining` gives one a TTL, as a
        // TTL node: the kit's servers keep them, so the `at_least` and
        // `set_remaining` cases run.)
        expiry_frees_the_name,
        waiter_wakes_on_expiry,
        renew_after_expiry_fails,
        dead_leader_is_replaced,
        stale_slot_holder_is_refused,
        crashed_permit_holder_frees_its_slot,
        crashed_job_frees_at_at_most,
        rw_crashed_holder_frees_the_name,
        // ...nor an end of each grant's own to compare a late grant's
        // lease with.
        late_grant_counts_from_the_waiters_request,
        // Sessions expire on the servers' monotonic timers; no wall clock
        // of theirs is stepped here (ZooKeeper is not run under faketime).
        server_clock_steps_are_judged_on_the_server,
    ],
);
