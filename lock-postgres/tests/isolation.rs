//! The whole conformance suite against a PostgreSQL whose default isolation
//! level is SERIALIZABLE: the backend must pin READ COMMITTED on every
//! transaction and session it opens, whatever the server's default.
//! (`tests/conformance.rs` runs it against a default server.) A binary of
//! its own, as the suite is: its timing cases must not share the machine
//! with the store tests' scale cases.

lock_conformance::suite!(lock_conformance::StoreFactory::postgres_with_settings(
    &[("default_transaction_isolation", "serializable")],
    |url| async move { lock_postgres::PostgresBackend::connect(&url).await }
),);
