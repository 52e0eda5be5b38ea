//! What the server says about itself at connect, and what `connect` refuses
//! or warns about: the version, the encoding, durability, the isolation of
//! a caller's pool, and whether the lock objects exist.

use std::time::Duration;

use lockcore::backend::timed;
use lockcore::{Failover, FenceDurability, LockError};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor, PgPool};

use crate::error::{self, BACKEND};
use crate::keys::schema::Ddl;
use crate::locks::sql;

/// The oldest server this crate runs on (`hashtextextended`, `ON CONFLICT`).
const MIN_SERVER_VERSION: i32 = 110_000;

/// What the server said about itself at connect.
#[derive(Debug)]
pub(crate) struct Facts {
    pub(crate) version: i32,
    encoding: String,
    fsync: String,
    synchronous_commit: String,
    synchronous_standby_names: String,
    default_isolation: String,
    pub(crate) objects_exist: bool,
}

impl Facts {
    /// Opens one connection within `connect_timeout` and reads the facts on
    /// it, so a server that cannot be reached or refuses us is reported at
    /// once, with its cause. The connection, pinned to READ COMMITTED, is
    /// handed back to become the pool's first.
    pub(crate) async fn first_connection(
        options: &PgConnectOptions,
        ddl: &Ddl,
        connect_timeout: Duration,
        server: &str,
    ) -> Result<(Facts, PgConnection), LockError> {
        let connected = tokio::time::timeout(connect_timeout, PgConnection::connect_with(options));
        let mut conn = match connected.await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(error::connecting(server, e)),
            Err(_) => {
                return Err(LockError::unavailable(
                    BACKEND,
                    format!(
                        "connecting to {server}: no connection within the connect timeout {connect_timeout:?}"
                    ),
                ));
            }
        };
        let facts = timed(BACKEND, "connect", connect_timeout, async {
            let facts = Facts::read(&mut conn, ddl).await.map_err(error::map)?;
            conn.execute(sql::PIN_ISOLATION).await.map_err(error::map)?;
            Ok(facts)
        })
        .await?;
        Ok((facts, conn))
    }

    /// Reads the facts on a connection of the caller's pool, which must run
    /// its sessions at READ COMMITTED.
    pub(crate) async fn of_pool(
        pool: &PgPool,
        ddl: &Ddl,
        limit: Duration,
        server: &str,
    ) -> Result<Facts, LockError> {
        let facts = timed(BACKEND, "connect", limit, async {
            let mut conn = pool.acquire().await.map_err(error::map)?;
            Facts::read(&mut conn, ddl).await.map_err(error::map)
        })
        .await?;
        if facts.default_isolation != "read committed" {
            return Err(LockError::config(format!(
                "{server}: the pool's sessions run at {}; lock statements need READ COMMITTED \
                 (run `{}` in the pool's after_connect)",
                facts.default_isolation.to_uppercase(),
                sql::PIN_ISOLATION
            )));
        }
        Ok(facts)
    }

    async fn read(conn: &mut PgConnection, ddl: &Ddl) -> Result<Facts, sqlx::Error> {
        let (
            version,
            encoding,
            fsync,
            synchronous_commit,
            synchronous_standby_names,
            default_isolation,
            objects_exist,
        ) = sqlx::query_as(
            "SELECT current_setting('server_version_num')::int4,
                        current_setting('server_encoding'),
                        current_setting('fsync'),
                        current_setting('synchronous_commit'),
                        current_setting('synchronous_standby_names'),
                        current_setting('default_transaction_isolation'),
                        to_regclass($1) IS NOT NULL
                          AND to_regclass($2) IS NOT NULL
                          AND to_regclass($3) IS NOT NULL
                          AND to_regclass($4) IS NOT NULL
                          AND to_regclass($5) IS NOT NULL
                          AND to_regclass($6) IS NOT NULL
                          AND to_regclass($7) IS NOT NULL
                          AND (SELECT EXISTS (
                               SELECT 1 FROM pg_attribute
                                WHERE attrelid = to_regclass($1) AND attname = 'label_owner'
                                  AND NOT attisdropped))",
        )
        .bind(&ddl.table)
        .bind(&ddl.sequence)
        .bind(&ddl.resource_fence)
        .bind(&ddl.permits)
        .bind(&ddl.epoch)
        .bind(&ddl.rw)
        .bind(&ddl.rw_intent)
        .fetch_one(conn)
        .await?;
        Ok(Facts {
            version,
            encoding,
            fsync,
            synchronous_commit,
            synchronous_standby_names,
            default_isolation,
            objects_exist,
        })
    }

    /// Refuses a server too old, or a database not in UTF8.
    pub(crate) fn check(&self, server: &str) -> Result<(), LockError> {
        if self.version < MIN_SERVER_VERSION {
            return Err(LockError::store(
                BACKEND,
                format!(
                    "{server} runs PostgreSQL {}; lock-postgres needs 11 or later",
                    self.version
                ),
            ));
        }
        if self.encoding != "UTF8" {
            return Err(LockError::config(format!(
                "{server}: the database encoding is {}; lock names are UTF-8, so the database must use UTF8",
                self.encoding
            )));
        }
        Ok(())
    }

    /// What a failover keeps: every grant when commits wait for a
    /// synchronous standby, else (asynchronous, or no standby named) only
    /// growing fences, or no overlap with a `lock_delay`.
    pub(crate) fn failover(&self, lock_delay: Option<std::time::Duration>) -> Failover {
        let waits_for_standby = matches!(
            self.synchronous_commit.as_str(),
            "on" | "remote_apply" | "remote_write"
        );
        if waits_for_standby && !self.synchronous_standby_names.trim().is_empty() {
            return Failover::Synchronous;
        }
        lock_delay.map_or(Failover::Asynchronous, Failover::LockDelay)
    }

    /// Durable fences need `fsync` on and `synchronous_commit` not off;
    /// otherwise warns and says what holds.
    pub(crate) fn durability(&self, server: &str) -> FenceDurability {
        if self.fsync == "on" && self.synchronous_commit != "off" {
            return FenceDurability::Durable;
        }
        tracing::warn!(
            %server, fsync = %self.fsync, synchronous_commit = %self.synchronous_commit,
            "PostgreSQL runs with relaxed durability: fencing tokens survive a server crash but may go back after an OS crash or power loss"
        );
        FenceDurability::Conditional(
            "the server runs with fsync or synchronous_commit off: fences survive a PostgreSQL crash, not an OS crash or power loss",
        )
    }
}
