//! The objects a lock table needs (schema, sequence, tables), their DDL, and
//! their creation at connect. A table missing from an older deployment
//! (the reader-writer tables, say) is created at the next connect, like
//! the label columns are added: with `create_schema`, else refused.

use sqlx::{Connection, PgConnection};

use crate::keys::ident::Ident;
use crate::locks::sql::BEGIN;

/// The sequence of a lock table is `<table>` + this.
pub(crate) const SEQUENCE_SUFFIX: &str = "_fence_seq";

/// The semaphores of a lock table live in `<table>` + this (shorter than
/// the sequence suffix, so it fits whenever the sequence's name does).
pub(crate) const PERMITS_SUFFIX: &str = "_permits";

/// The holders of a lock table's reader-writer locks live in `<table>` +
/// this, one row per holder.
pub(crate) const RW_SUFFIX: &str = "_rw";

/// The intents of writers waiting for a reader-writer lock live in
/// `<table>` + this (as long as the sequence suffix: it fits whenever the
/// sequence's name does).
pub(crate) const RW_INTENT_SUFFIX: &str = "_rw_intent";

/// The timeline a lock table's fences were last handed out on lives in
/// `<table>` + this (see `fence/failover.rs`).
pub(crate) const EPOCH_SUFFIX: &str = "_epoch";

/// The resource-side fencing table created next to the lock table.
pub(crate) const RESOURCE_FENCE_TABLE: &str = "resource_fence";

/// The DDL of one lock table and its companions, built from validated,
/// quoted identifiers. Every statement is idempotent.
#[derive(Debug)]
pub(crate) struct Ddl {
    /// `"schema"."table"` and friends, as text for `to_regclass`.
    pub(crate) table: String,
    pub(crate) sequence: String,
    pub(crate) permits: String,
    pub(crate) rw: String,
    pub(crate) rw_intent: String,
    pub(crate) epoch: String,
    pub(crate) resource_fence: String,
    schema: Ident,
    create_schema: String,
    create_sequence: String,
    create_table: String,
    create_permits: String,
    create_rw: String,
    create_rw_intent: String,
    create_epoch: String,
    /// Adds the label columns to a table made by a version without them.
    add_labels: String,
    /// Starts a re-created sequence above every fence left in the table,
    /// so an operator who dropped the sequence cannot make fences go back.
    resync_sequence: String,
    create_resource_fence: String,
}

impl Ddl {
    pub(crate) fn new(schema: &Ident, table: &Ident, sequence: &Ident) -> Ddl {
        let t = format!("{}.{}", schema.quoted(), table.quoted());
        let seq = format!("{}.{}", schema.quoted(), sequence.quoted());
        let companion =
            |suffix: &str| format!("{}.{}", schema.quoted(), table.with_suffix(suffix).quoted());
        let permits = companion(PERMITS_SUFFIX);
        let (rw, rw_intent) = (companion(RW_SUFFIX), companion(RW_INTENT_SUFFIX));
        let epoch = companion(EPOCH_SUFFIX);
        let resource_fence = format!(
            "{}.{}",
            schema.quoted(),
            Ident::new("table", RESOURCE_FENCE_TABLE, Ident::MAX_BYTES)
                .expect("constant identifier")
                .quoted()
        );
        Ddl {
            create_schema: format!("CREATE SCHEMA IF NOT EXISTS {}", schema.quoted()),
            create_sequence: format!(
                "CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE"
            ),
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    name       text COLLATE \"C\" PRIMARY KEY,
                    owner      uuid,
                    fence      bigint NOT NULL CHECK (fence > 0),
                    expires_at timestamptz NOT NULL,
                    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                    label      text,
                    label_owner uuid
                )"
            ),
            // One row per semaphore slot; fences come from the lock table's
            // sequence. `permits` is the count its holder agreed on.
            create_permits: format!(
                "CREATE TABLE IF NOT EXISTS {permits} (
                    name       text COLLATE \"C\" NOT NULL,
                    slot       int4 NOT NULL CHECK (slot >= 0),
                    permits    int4 NOT NULL CHECK (permits > 0),
                    owner      uuid,
                    fence      bigint NOT NULL CHECK (fence > 0),
                    expires_at timestamptz NOT NULL,
                    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                    label      text,
                    PRIMARY KEY (name, slot)
                )"
            ),
            // One row per holder of a reader-writer lock (deleted at
            // release, swept once expired); fences from the same sequence.
            create_rw: format!(
                "CREATE TABLE IF NOT EXISTS {rw} (
                    name       text COLLATE \"C\" NOT NULL,
                    owner      uuid NOT NULL,
                    access     text NOT NULL CHECK (access IN ('read', 'write')),
                    fence      bigint NOT NULL CHECK (fence > 0),
                    expires_at timestamptz NOT NULL,
                    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                    label      text,
                    PRIMARY KEY (name, owner)
                )"
            ),
            // One row per writer waiting for a reader-writer lock: no
            // reader is granted while a live one is there.
            create_rw_intent: format!(
                "CREATE TABLE IF NOT EXISTS {rw_intent} (
                    name       text COLLATE \"C\" NOT NULL,
                    intent     uuid NOT NULL,
                    expires_at timestamptz NOT NULL,
                    PRIMARY KEY (name, intent)
                )"
            ),
            // One row: the timeline (of the server's WAL) the table's fences
            // were last handed out on.
            create_epoch: format!(
                "CREATE TABLE IF NOT EXISTS {epoch} (
                    id       boolean PRIMARY KEY DEFAULT true CHECK (id),
                    timeline text NOT NULL,
                    seen_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                    -- after a failover with a lock delay: no grant before
                    grants_from timestamptz NOT NULL DEFAULT '-infinity'
                )"
            ),
            add_labels: format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS label text,
                                 ADD COLUMN IF NOT EXISTS label_owner uuid"
            ),
            // `seq` holds only identifier characters and double quotes, so
            // it is safe inside a single-quoted literal.
            resync_sequence: format!(
                "SELECT setval('{seq}'::regclass, max(fence))
                   FROM (SELECT fence FROM {t} UNION ALL SELECT fence FROM {permits}
                         UNION ALL SELECT fence FROM {rw}) fences
                 HAVING max(fence) IS NOT NULL"
            ),
            create_resource_fence: resource_fence_table(&resource_fence),
            table: t,
            sequence: seq,
            permits,
            rw,
            rw_intent,
            epoch,
            resource_fence,
            schema: schema.clone(),
        }
    }

    /// Creates what is missing, serialised by an advisory lock per schema
    /// so concurrent first uses (of any table of the schema: they share the
    /// schema and its `resource_fence`) cannot race on the catalog.
    pub(crate) async fn create(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let mut tx = conn.begin_with(BEGIN).await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("distlock ddl {}", self.schema.quoted()))
            .execute(&mut *tx)
            .await?;
        // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when
        // the schema exists; only try it when it is missing.
        let schema_exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(self.schema.as_str())
                .fetch_one(&mut *tx)
                .await?;
        if !schema_exists {
            sqlx::query(&self.create_schema).execute(&mut *tx).await?;
        }
        let sequence_existed: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&self.sequence)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query(&self.create_sequence).execute(&mut *tx).await?;
        sqlx::query(&self.create_table).execute(&mut *tx).await?;
        // ALTER TABLE locks the table out for a moment: only when needed.
        let labelled: bool = sqlx::query_scalar(LABELLED)
            .bind(&self.table)
            .fetch_one(&mut *tx)
            .await?;
        if !labelled {
            sqlx::query(&self.add_labels).execute(&mut *tx).await?;
        }
        sqlx::query(&self.create_permits).execute(&mut *tx).await?;
        sqlx::query(&self.create_rw).execute(&mut *tx).await?;
        sqlx::query(&self.create_rw_intent)
            .execute(&mut *tx)
            .await?;
        sqlx::query(&self.create_epoch).execute(&mut *tx).await?;
        if !sequence_existed {
            sqlx::query(&self.resync_sequence).execute(&mut *tx).await?;
        }
        sqlx::query(&self.create_resource_fence)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}

/// `$1` a table's regclass text → whether it has the label columns.
pub(crate) const LABELLED: &str = "SELECT EXISTS (
    SELECT 1 FROM pg_attribute
     WHERE attrelid = to_regclass($1) AND attname = 'label_owner' AND NOT attisdropped)";

/// DDL of a resource fence table named `qualified` (already quoted).
pub(crate) fn resource_fence_table(qualified: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {qualified} (
            resource   text COLLATE \"C\" PRIMARY KEY,
            last_token bigint NOT NULL CHECK (last_token > 0),
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
        )"
    )
}
