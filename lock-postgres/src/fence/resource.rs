//! Resource-side fencing in PostgreSQL: [`fenced_write`] checks and records
//! a fencing token inside the caller's own transaction, so the caller's
//! write commits only if no newer holder wrote first.

use std::sync::LazyLock;

use lockcore::{Fenced, FencingToken, LockError, StaleToken};
use sqlx::{Postgres, Transaction};

use crate::error;
use crate::keys::ident::Ident;
use crate::keys::schema::{RESOURCE_FENCE_TABLE, resource_fence_table};

/// Separates a resource from its slot in the fence table's key; refused in
/// resource names, so every key means one resource (and one slot).
const SLOT_SEPARATOR: char = '\u{1f}';

/// A table of `(resource, last_token)` rows: per resource (or resource and
/// semaphore slot), the highest fencing token whose transaction wrote.
///
/// [`PostgresBackend`](crate::PostgresBackend) creates
/// `<its schema>.resource_fence` next to its lock table
/// ([`PostgresBackend::resource_fence`](crate::PostgresBackend::resource_fence));
/// use [`ensure_table`](Self::ensure_table) when the protected data lives in
/// another database.
#[derive(Debug, Clone)]
pub struct ResourceFence {
    record: String,
    highest: String,
    create: String,
}

impl Default for ResourceFence {
    /// `public.resource_fence`.
    fn default() -> Self {
        ResourceFence::new("public", RESOURCE_FENCE_TABLE).expect("constant identifiers are valid")
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
            // Raises the mark, or (an older token) matches nothing and
            // leaves the row locked until the caller's transaction ends.
            record: format!(
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
    /// The store error, e.g. without `CREATE` permission on the schema.
    pub async fn ensure_table(&self, conn: &mut sqlx::PgConnection) -> Result<(), LockError> {
        sqlx::query(&self.create)
            .execute(conn)
            .await
            .map(drop)
            .map_err(error::map)
    }

    /// [`fenced_write`] on this table.
    ///
    /// # Errors
    /// As [`fenced_write`].
    pub async fn write(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        resource: &str,
        token: FencingToken,
    ) -> Result<Fenced<()>, LockError> {
        self.record(tx, checked(resource)?, token).await
    }

    /// [`fenced_write_slot`] on this table.
    ///
    /// # Errors
    /// As [`fenced_write`].
    pub async fn write_slot(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        resource: &str,
        slot: u32,
        token: FencingToken,
    ) -> Result<Fenced<()>, LockError> {
        let key = format!("{}{SLOT_SEPARATOR}{slot}", checked(resource)?);
        self.record(tx, &key, token).await
    }

    async fn record(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        key: &str,
        token: FencingToken,
    ) -> Result<Fenced<()>, LockError> {
        let value = i64::try_from(token.get()).map_err(|_| {
            LockError::config(format!(
                "fencing token {token} does not fit PostgreSQL's bigint: it did not come from a lock of a distlock backend"
            ))
        })?;
        let raised: Option<i64> = sqlx::query_scalar(&self.record)
            .bind(key)
            .bind(value)
            .fetch_optional(&mut **tx)
            .await
            .map_err(error::map)?;
        if raised.is_some() {
            return Ok(Ok(()));
        }
        // Refused: the row is now locked by this transaction, so this read
        // sees the mark that beat us.
        let highest: i64 = sqlx::query_scalar(&self.highest)
            .bind(key)
            .fetch_one(&mut **tx)
            .await
            .map_err(error::map)?;
        let highest = u64::try_from(highest)
            .ok()
            .and_then(FencingToken::new)
            .ok_or_else(|| error::corrupt(format!("the fence table holds {highest}")))?;
        Ok(Err(StaleToken { token, highest }))
    }
}

/// A resource name, refused if it holds the slot separator.
fn checked(resource: &str) -> Result<&str, LockError> {
    if resource.contains(SLOT_SEPARATOR) {
        return Err(LockError::config(format!(
            "resource name {:?} contains U+001F, which fenced writes reserve for semaphore slots",
            resource.chars().take(70).collect::<String>()
        )));
    }
    Ok(resource)
}

/// The fenced write of PostgreSQL: in `tx`, the caller's own transaction,
/// refuses `token` if a newer token already wrote to `resource`, and
/// records it otherwise (on the default table `public.resource_fence`;
/// [`PostgresBackend::resource_fence`](crate::PostgresBackend::resource_fence)
/// names the table next to a backend's lock table).
///
/// Call it first, then write in the same transaction and commit: the check
/// locks the resource's fence row until `tx` ends, so a newer holder's
/// check waits for this transaction, and a stale holder (`Ok(Err(StaleToken))`)
/// rolls back without writing. Equal tokens pass: one holder may write many
/// times under one grant.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, guard: lockcore::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// if let Err(stale) = lock_postgres::fenced_write(&mut tx, "inventory:42", guard.fencing_token()).await? {
///     tx.rollback().await?; // a newer holder already wrote: touch nothing
///     return Err(stale.into());
/// }
/// sqlx::query("UPDATE inventory SET quantity = quantity - 1 WHERE id = $1 AND quantity > 0")
///     .bind(42_i64)
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::InvalidConfig`] for a token that does not fit a `bigint`
/// or a resource name holding U+001F; store errors as `Unavailable`
/// (retryable: connection, serialization failure at REPEATABLE READ or
/// above — retry the transaction) or `Store`.
pub async fn fenced_write(
    tx: &mut Transaction<'_, Postgres>,
    resource: &str,
    token: FencingToken,
) -> Result<Fenced<()>, LockError> {
    DEFAULT.write(tx, resource, token).await
}

/// [`fenced_write`] for a resource fenced per semaphore slot: the token is
/// checked against the newest one written through the same `slot` of
/// `resource` (pass [`LockGuard::slot`](lockcore::LockGuard::slot)), so a
/// paused permit holder whose slot was granted again is refused, and
/// holders of other slots are not.
///
/// # Errors
/// As [`fenced_write`].
pub async fn fenced_write_slot(
    tx: &mut Transaction<'_, Postgres>,
    resource: &str,
    slot: u32,
    token: FencingToken,
) -> Result<Fenced<()>, LockError> {
    DEFAULT.write_slot(tx, resource, slot, token).await
}

static DEFAULT: LazyLock<ResourceFence> = LazyLock::new(ResourceFence::default);
