//! The whole conformance suite against a PostgreSQL whose default isolation
//! level is SERIALIZABLE: the backend must pin READ COMMITTED on every
//! transaction and session it opens, whatever the server's default.
//! (`tests/conformance.rs` runs it against a default server; this one is a
//! module of the store binary so it is not linked on its own.)

lock_conformance::suite!(
    lock_conformance::kit::stores::postgres::factory_with_settings(
        &[("default_transaction_isolation", "serializable")],
        |url| async move { lock_postgres::PostgresBackend::connect(&url).await }
    )
);
