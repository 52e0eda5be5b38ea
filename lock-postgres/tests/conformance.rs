//! The whole conformance suite against a real PostgreSQL launched by the
//! harness (or the server `LOCK_TEST_POSTGRES_URL` names).

lock_conformance::suite!(
    lock_conformance::StoreFactory::postgres(|url| async move {
        lock_postgres::PostgresBackend::connect(&url).await
    }),
    // No set_remaining yet (the default, Unsupported): the cases of
    // `at_least` and set_remaining skip.
    expect_skips = [
        job_at_least_holds_on_the_stores_clock,
        set_remaining_is_exact_and_owner_checked,
    ],
);
