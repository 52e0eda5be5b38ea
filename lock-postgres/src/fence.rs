//! Resource-side fencing in PostgreSQL: `fence_check` inside the caller's
//! own transaction refuses a token older than the newest one already seen
//! for that resource, and raises the mark otherwise.

use std::sync::LazyLock;

use lockcore::{FencingToken, LockError, StaleToken};
use sqlx::{Postgres, Transaction};

use crate::ident::Ident;
use crate::schema::resource_fence_table;

/// Why a [`fence_check`] did not pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer token was already seen for this resource: the caller is a
    /// stale holder and must roll back.
    #[error(transparent)]
    Stale(#[from] StaleToken),
    /// The token does not fit PostgreSQL's `bigint`; no fence of this crate
    /// is that large, so it did not come from a lock.
    #[error("fencing token {0} does not fit a PostgreSQL bigint")]
    OutOfRange(FencingToken),
    /// The check itself failed (connection, permissions, serialization
    /// failure at REPEATABLE READ or above: retry the transaction).
    #[error("fence check failed: {0}")]
    Database(#[from] sqlx::Error),
}

/// A table of `(resource, last_token)` rows: per resource, the highest
/// fencing token whose transaction passed the check.
///
/// [`PostgresBackend`](crate::PostgresBackend) creates
/// `<its schema>.resource_fence` next to its lock table; use
/// [`ensure_table`](Self::ensure_table) when the protected data lives in
/// another database.
#[derive(Debug, Clone)]
pub struct ResourceFence {
    check: String,
    highest: String,
    create: String,
}

impl Default for ResourceFence {
    /// `public.resource_fence`.
    fn default() -> Self {
        ResourceFence::new("public", crate::schema::RESOURCE_FENCE_TABLE)
            .expect("constant identifiers are valid")
    }
}

impl ResourceFence {
    /// The fence table `schema.table` (both validated as identifiers and quoted).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a name that is not a safe identifier.
    pub fn new(schema: &str, table: &str) -> Result<Self, LockError> {
        let schema = Ident::new("schema", schema, Ident::MAX_BYTES)?;
        let table = Ident::new("table", table, Ident::MAX_BYTES)?;
        let t = format!("{}.{}", schema.quoted(), table.quoted());
        Ok(ResourceFence {
            check: format!(
                "INSERT INTO {t} AS f (resource, last_token, updated_at)
                 VALUES ($1, $2, clock_timestamp())
                 ON CONFLICT (resource) DO UPDATE
                    SET last_token = EXCLUDED.last_token, updated_at = clock_timestamp()
                    WHERE f.last_token <= EXCLUDED.last_token
                 RETURNING last_token"
            ),
            highest: format!("SELECT last_token FROM {t} WHERE resource = $1"),
            create: resource_fence_table(&t),
        })
    }

    /// Creates the table if it is missing.
    ///
    /// # Errors
    /// The database error, e.g. without `CREATE` permission on the schema.
    pub async fn ensure_table(&self, conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
        sqlx::query(&self.create).execute(conn).await.map(drop)
    }

    /// Checks `token` for `resource` inside `tx`; see [`fence_check`].
    ///
    /// # Errors
    /// [`FenceError::Stale`] when a newer token was seen: roll `tx` back.
    pub async fn check(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        resource: &str,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        let value = i64::try_from(token.get()).map_err(|_| FenceError::OutOfRange(token))?;
        let raised: Option<i64> = sqlx::query_scalar(&self.check)
            .bind(resource)
            .bind(value)
            .fetch_optional(&mut **tx)
            .await?;
        if raised.is_some() {
            return Ok(());
        }
        // Refused: the row is now locked by this transaction, so this read
        // sees the mark that beat us.
        let highest: i64 = sqlx::query_scalar(&self.highest)
            .bind(resource)
            .fetch_one(&mut **tx)
            .await?;
        let highest = u64::try_from(highest)
            .ok()
            .and_then(FencingToken::new)
            .ok_or(sqlx::Error::RowNotFound)?;
        Err(StaleToken { token, highest }.into())
    }
}

/// Refuses `token` if a newer token was already seen for `resource`, and
/// records it otherwise, in `tx` (the caller's transaction, on the default
/// table `public.resource_fence`).
///
/// Run it in the same transaction as the protected write: the check locks
/// the resource's fence row until `tx` ends, so a newer holder's check
/// waits for this transaction, and a stale holder's write is rolled back
/// with its failed check. Equal tokens pass: one holder may write many
/// times under one grant.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, guard: lockcore::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// lock_postgres::fence_check(&mut tx, "inventory:42", guard.fencing_token()).await?;
/// sqlx::query("UPDATE inventory SET quantity = quantity - 1 WHERE id = $1 AND quantity > 0")
///     .bind(42_i64)
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`FenceError::Stale`] for an older token (roll back), [`FenceError::Database`]
/// when the check could not run.
pub async fn fence_check(
    tx: &mut Transaction<'_, Postgres>,
    resource: &str,
    token: FencingToken,
) -> Result<(), FenceError> {
    static DEFAULT: LazyLock<ResourceFence> = LazyLock::new(ResourceFence::default);
    DEFAULT.check(tx, resource, token).await
}
