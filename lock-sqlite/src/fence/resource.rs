//! Resource-side fencing in SQLite: [`fenced_write`] checks and records a
//! fencing token inside the caller's own transaction, on the database that
//! holds the data the lock protects (never the lock file, which is
//! distlock's alone), so the caller's write commits only if no newer holder
//! wrote first.

use std::sync::LazyLock;

use lockcore::{Fenced, FencingToken, LockError, StaleToken};
use sqlx::{Sqlite, SqliteConnection, Transaction};

use crate::error;

/// Separates a resource from its slot in the fence table's key; refused in
/// resource names, so every key means one resource (and one slot).
const SLOT_SEPARATOR: char = '\u{1f}';

/// The default fence table.
const DEFAULT_TABLE: &str = "distlock_resource_fence";

/// A table of `(resource, last_token)` rows in your database: per resource
/// (or resource and semaphore slot), the highest fencing token whose
/// transaction wrote. Created on first use.
#[derive(Debug, Clone)]
pub struct ResourceFence {
    record: String,
    highest: String,
    create: String,
}

impl Default for ResourceFence {
    /// `distlock_resource_fence`.
    fn default() -> Self {
        ResourceFence::new(DEFAULT_TABLE).expect("a valid constant identifier")
    }
}

impl ResourceFence {
    /// The fence table `table` (ASCII letters, digits and `_`, not starting
    /// with a digit, at most 64 bytes; quoted).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for any other name.
    pub fn new(table: &str) -> Result<Self, LockError> {
        let valid = !table.is_empty()
            && table.len() <= 64
            && !table.starts_with(|c: char| c.is_ascii_digit())
            && table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(LockError::config(format!(
                "fence table name {:?} must be 1 to 64 ASCII letters, digits or _, not starting \
                 with a digit",
                table.chars().take(70).collect::<String>()
            )));
        }
        let t = format!("\"{table}\"");
        Ok(ResourceFence {
            // Raises the mark, or (an older token) changes nothing; either
            // way the statement took the database's write lock, held until
            // the caller's transaction ends.
            record: format!(
                "INSERT INTO {t} (resource, last_token) VALUES (?1, ?2)
                 ON CONFLICT (resource) DO UPDATE SET last_token = excluded.last_token
                    WHERE last_token <= excluded.last_token
                 RETURNING last_token"
            ),
            highest: format!("SELECT last_token FROM {t} WHERE resource = ?1"),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    resource   TEXT    NOT NULL PRIMARY KEY,
                    last_token INTEGER NOT NULL CHECK (last_token > 0)
                )"
            ),
        })
    }

    /// Creates the table if it is missing ([`write`](Self::write) does it
    /// too, the first time).
    ///
    /// # Errors
    /// The store error (a read-only database, say).
    pub async fn ensure_table(&self, conn: &mut SqliteConnection) -> Result<(), LockError> {
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
        tx: &mut Transaction<'_, Sqlite>,
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
        tx: &mut Transaction<'_, Sqlite>,
        resource: &str,
        slot: u32,
        token: FencingToken,
    ) -> Result<Fenced<()>, LockError> {
        let key = format!("{}{SLOT_SEPARATOR}{slot}", checked(resource)?);
        self.record(tx, &key, token).await
    }

    async fn record(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        key: &str,
        token: FencingToken,
    ) -> Result<Fenced<()>, LockError> {
        let value = i64::try_from(token.get()).map_err(|_| {
            LockError::config(format!(
                "fencing token {token} does not fit a SQLite integer: it did not come from a lock of a distlock backend"
            ))
        })?;
        let raised = match self.raise(tx, key, value).await {
            Err(e) if is_missing_table(&e) => {
                self.ensure_table(tx).await?;
                self.raise(tx, key, value).await
            }
            other => other,
        }
        .map_err(error::map)?;
        if raised.is_some() {
            return Ok(Ok(()));
        }
        // Refused: this transaction holds the write lock, so this read sees
        // the mark that beat us.
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

    async fn raise(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        key: &str,
        value: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(&self.record)
            .bind(key)
            .bind(value)
            .fetch_optional(&mut **tx)
            .await
    }
}

fn is_missing_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.message().starts_with("no such table"))
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

/// The fenced write of SQLite: in `tx`, the caller's own transaction on the
/// database that holds the protected data, refuses `token` if a newer token
/// already wrote to `resource`, and records it otherwise (in the table
/// `distlock_resource_fence` of that database, created on first use;
/// [`ResourceFence::new`] names another).
///
/// Call it first in the transaction, then write and commit: its statement
/// takes the database's write lock, which SQLite holds until `tx` ends, so
/// no other writer's check can come between this check and your write, and
/// a stale holder (`Ok(Err(StaleToken))`) rolls back without writing. Equal
/// tokens pass: one holder may write many times under one grant. (A
/// transaction that read before calling it may have to retry: SQLite
/// refuses to turn a reader into a writer once another writer committed
/// since its read, and that is `Unavailable`. Begin it with `BEGIN
/// IMMEDIATE` to take the write lock from the start.)
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool, guard: lockcore::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// if let Err(stale) = lock_sqlite::fenced_write(&mut tx, "inventory:42", guard.fencing_token()).await? {
///     tx.rollback().await?; // a newer holder already wrote: touch nothing
///     return Err(stale.into());
/// }
/// sqlx::query("UPDATE inventory SET quantity = quantity - 1 WHERE id = ?1 AND quantity > 0")
///     .bind(42_i64)
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::InvalidConfig`] for a token above `i64::MAX` or a resource
/// name holding U+001F; store errors as `Unavailable` (retryable: the
/// database busy past its timeout; retry the transaction) or `Store`.
pub async fn fenced_write(
    tx: &mut Transaction<'_, Sqlite>,
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
    tx: &mut Transaction<'_, Sqlite>,
    resource: &str,
    slot: u32,
    token: FencingToken,
) -> Result<Fenced<()>, LockError> {
    DEFAULT.write_slot(tx, resource, slot, token).await
}

static DEFAULT: LazyLock<ResourceFence> = LazyLock::new(ResourceFence::default);
