//! The whole conformance suite against a SQLite lock file in a temp dir of
//! its own per case (the one `LOCK_TEST_SQLITE_URL` names in the suite's
//! lock-taker processes). "Store crash" kills every client process of the
//! file and reopens it; "store pause" stops a process that holds the
//! file's write lock. The cases that need a network link to cut skip: a
//! lock file has none (see `support::SqliteFactory::no_proxy_reason`).

#[path = "store/support.rs"]
mod support;

lock_conformance::suite!(
    support::SqliteFactory::new(),
    // No network between client and store (a local file): the proxy cases
    // have nothing to cut; a stopped or killed process stands in for them.
    // Expiry runs on CLOCK_BOOTTIME, which no wall-clock step moves.
    expect_skips = [
        partitioned_holder_is_fenced_out,
        slow_renewal_counts_as_lost,
        reset_mid_hold_keeps_or_reports,
        lost_acquire_reply_leaves_no_phantom,
        lost_release_reply_frees_within_ttl,
        late_grant_counts_from_the_waiters_request,
        dropped_attempt_leaves_no_phantom,
        nemesis_history_is_clean,
        server_clock_steps_are_judged_on_the_server,
    ],
);

/// Not a test: the helper processes of `support` (a writer to kill mid-write,
/// a process that stalls the file's write lock).
#[test]
#[ignore = "helper process for the store crash and stall cases, run by the tests themselves"]
fn sqlite_helper_process() {
    support::helper_main();
}
