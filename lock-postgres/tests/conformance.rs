//! The whole conformance suite against a real PostgreSQL launched by the
//! harness (or the server `LOCK_TEST_POSTGRES_URL` names).

lock_conformance::suite!(lock_conformance::StoreFactory::postgres(|url| async move {
    lock_postgres::PostgresBackend::connect(&url).await
}),);
