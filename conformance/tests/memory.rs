//! The whole suite against the reference backend. The cases that need a
//! store process to hurt (fault proxy, lock-taker, private store) skip.

lock_conformance::suite!(
    lock_conformance::shared(lockcore::MemoryBackend::new()),
    expect_skips = [
        killed_holder_frees_the_name,
        partitioned_holder_is_fenced_out,
        slow_renewal_counts_as_lost,
        reset_mid_hold_keeps_or_reports,
        lost_acquire_reply_leaves_no_phantom,
        lost_release_reply_frees_within_ttl,
        late_grant_counts_from_the_waiters_request,
        dropped_attempt_leaves_no_phantom,
        fences_survive_store_crash,
        store_pause_keeps_invariants,
        server_clock_steps_are_judged_on_the_server,
        paused_client_is_fenced_out,
        nemesis_history_is_clean,
    ],
);
