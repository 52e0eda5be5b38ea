//! The cases, one module per concern. Each case is a plain
//! `pub async fn(&Ctx) -> CaseResult`; the list in [`__for_each_case`](crate::__for_each_case)
//! is the single place that names them all.

pub mod admin;
pub mod bad_input;
pub mod clock;
pub mod close;
pub mod concurrency;
pub mod election;
pub mod exclusion;
pub mod expiry;
pub mod failover;
pub mod faults;
pub mod fence_floor;
pub mod fencing;
pub mod hold;
pub mod jobs;
pub mod labels;
pub mod loss;
pub mod multi;
pub mod nemesis;
pub mod notify;
pub mod permit_expiry;
pub mod processes;
pub mod release;
pub mod renewal;
pub mod rw;
pub mod semaphores;
pub mod waiting;

/// How far `lease`'s local deadline lies past the latest one a request sent
/// at `sent` and answered at `answered` can honestly claim: `sent + ttl -
/// drift(ttl)`, plus what the backend may do before the request leaves (half
/// the call, plus 5 ms scaled). Zero when within. A deadline counted from
/// the reply, without the drift margin, or from a late internal retry
/// overshoots by about the call's length, the drift, or the retry's delay.
pub(crate) fn deadline_overshoot(
    cx: &crate::Ctx,
    lease: &lockcore::Lease,
    sent: tokio::time::Instant,
    answered: tokio::time::Instant,
) -> std::time::Duration {
    let ttl = lease.ttl().get();
    let call = answered.saturating_duration_since(sent);
    let latest = sent
        + ttl.saturating_sub(lockcore::Lease::drift(ttl))
        + call / 2
        + cx.scaled(std::time::Duration::from_millis(5));
    lease.deadline().saturating_duration_since(latest)
}

/// The cases that kill, pause, restart or step the clock of a store of their
/// own ([`Ctx::private_store`](crate::Ctx::private_store)). Against a store
/// the suite did not start (a `LOCK_TEST_*` variable), they skip: that is
/// what CI lists in [`EXPECT_SKIPS_ENV`](crate::EXPECT_SKIPS_ENV).
pub const PRIVATE_STORE_CASES: &[&str] = &[
    "fences_survive_store_crash",
    "store_pause_keeps_invariants",
    "server_clock_steps_are_judged_on_the_server",
];

/// Calls macro `$cb` with `$args` followed by every case as `group::case`.
/// This list is the suite: [`CASES`](crate::CASES) and [`suite!`](crate::suite)
/// both come from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_case {
    ($cb:ident $args:tt) => {
        $crate::$cb! { $args
            exclusion::exclusive_between_clients,
            exclusion::independent_names,
            release::release_is_owner_checked,
            release::release_is_idempotent,
            renewal::renew_extends_and_keeps_fence,
            renewal::renew_after_expiry_fails,
            renewal::renew_many_judges_each_lease,
            expiry::expiry_frees_the_name,
            expiry::waiter_wakes_on_expiry,
            fencing::fences_increase_across_cycles,
            waiting::acquire_times_out_within_bounds,
            waiting::waiter_wakes_on_release,
            waiting::cancelled_acquire_leaves_nothing,
            waiting::every_waiter_is_served,
            loss::lost_fires_on_force_release,
            loss::lost_fires_at_the_deadline,
            loss::with_lock_stops_when_lost,
            loss::guard_drop_releases,
            admin::inspect_reports_the_holder,
            admin::force_release_fences_out_the_holder,
            admin::effective_ttl_is_truthful,
            concurrency::fenced_counter_is_exact,
            concurrency::random_workload_history_is_clean,
            bad_input::odd_names_are_distinct_locks,
            bad_input::invalid_ttls_and_waits_are_rejected,
            bad_input::invalid_names_are_rejected,
            bad_input::forged_leases_are_refused,
            processes::killed_holder_frees_the_name,
            faults::partitioned_holder_is_fenced_out,
            faults::slow_renewal_counts_as_lost,
            faults::reset_mid_hold_keeps_or_reports,
            faults::lost_acquire_reply_leaves_no_phantom,
            faults::lost_release_reply_frees_within_ttl,
            faults::late_grant_counts_from_the_waiters_request,
            faults::dropped_attempt_leaves_no_phantom,
            faults::fences_survive_store_crash,
            faults::store_pause_keeps_invariants,
            clock::server_clock_steps_are_judged_on_the_server,
            processes::paused_client_is_fenced_out,
            nemesis::nemesis_history_is_clean,
            labels::labels_round_trip_through_inspect,
            labels::default_label_is_host_and_pid,
            labels::labels_never_decide_ownership,
            hold::max_hold_ends_the_hold,
            notify::watch_wakes_on_release,
            notify::watch_permits_wakes_on_release,
            semaphores::permits_never_exceed_n,
            semaphores::cancelled_permit_wait_leaves_nothing,
            semaphores::permit_count_disagreement_is_refused,
            semaphores::zero_permits_are_refused,
            multi::multi_lock_is_all_or_nothing,
            multi::multi_lock_opposite_orders_never_overlap,
            multi::multi_lock_leaves_nothing_behind,
            multi::multi_lock_is_lost_with_any_member,
            multi::multi_lock_waits_holding_nothing,
            rw::rw_readers_share_writers_exclude,
            rw::rw_waiting_writer_is_served_within_bound,
            rw::rw_fences_refuse_stale_holders,
            rw::rw_crashed_holder_frees_the_name,
            rw::rw_writer_that_gave_up_leaves_nothing,
            permit_expiry::stale_slot_holder_is_refused,
            permit_expiry::crashed_permit_holder_frees_its_slot,
            election::one_leader_at_a_time,
            election::observers_see_every_change,
            election::dead_leader_is_replaced,
            fence_floor::fence_floor_lifts_every_grant,
            fence_floor::fence_floor_beyond_the_counter_is_refused,
            fence_floor::fence_floor_lifts_a_waiter_queued_before_it,
            close::close_loses_and_frees_what_it_held,
            close::closed_waiter_leaves_nothing,
            jobs::job_at_least_holds_on_the_stores_clock,
            jobs::crashed_job_frees_at_at_most,
            jobs::job_once_per_window_holds_across_nodes,
            jobs::job_fence_grows_per_run,
            jobs::set_remaining_is_exact_and_owner_checked,
        }
    };
}
