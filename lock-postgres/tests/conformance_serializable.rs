//! The whole conformance suite against a PostgreSQL whose default isolation
//! level is SERIALIZABLE: the backend must pin READ COMMITTED on every
//! transaction and session it opens, whatever the server's default.

lock_conformance::suite!(
    lock_conformance::kit::stores::postgres::factory_with_settings(
        &[("default_transaction_isolation", "serializable")],
        |url| async move { lock_postgres::PostgresBackend::connect(&url).await }
    )
);
