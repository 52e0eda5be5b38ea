//! The schema of the lock file: created in an empty file, upgraded in place
//! in a file of an older schema, inside the connecting client's `BEGIN
//! IMMEDIATE` (so two clients connecting at once create or upgrade it
//! once: the second sees the first's work). A new file gets the first
//! schema and then every upgrade, so new and upgraded files are the same.

use std::path::Path;

use lockcore::LockError;
use sqlx::SqliteConnection;

use crate::error::{self, shown};
use crate::keys;

/// Creates the schema in an empty database, or upgrades a lock file of an
/// older schema, through `conn`, inside the caller's `BEGIN IMMEDIATE`
/// (which it commits).
///
/// # Errors
/// [`LockError::InvalidConfig`] for a database that became another
/// program's, or a newer distlock's, since it was looked at; the store
/// error otherwise.
pub(crate) async fn create_or_upgrade(
    conn: &mut SqliteConnection,
    path: &Path,
) -> Result<(), LockError> {
    let app: i64 = scalar(conn, "PRAGMA application_id").await?;
    let version = if app == keys::APPLICATION_ID {
        scalar(conn, "PRAGMA user_version").await?
    } else {
        let tables = scalar(conn, "SELECT count(*) FROM sqlite_schema").await?;
        if app != 0 || tables != 0 {
            return Err(LockError::config(format!(
                "{} became another program's database while connecting; distlock leaves it \
                 untouched",
                shown(path)
            )));
        }
        run(conn, keys::CREATE).await?;
        1
    };
    if version > keys::SCHEMA_VERSION {
        return Err(newer(path, version));
    }
    if version == keys::SCHEMA_VERSION {
        return Ok(());
    }
    let from = usize::try_from(version - 1).unwrap_or(0);
    for upgrade in &keys::UPGRADES[from..] {
        run(conn, upgrade).await?;
    }
    if app == keys::APPLICATION_ID {
        tracing::info!(path = %shown(path), from = version, to = keys::SCHEMA_VERSION, "lock file schema upgraded");
    }
    run(conn, keys::STAMP).await
}

/// A lock file of a schema this distlock does not know.
pub(crate) fn newer(path: &Path, version: i64) -> LockError {
    LockError::config(format!(
        "{} was written by a newer distlock (schema {version}, this one knows {}): upgrade",
        shown(path),
        keys::SCHEMA_VERSION
    ))
}

async fn scalar(conn: &mut SqliteConnection, query: &str) -> Result<i64, LockError> {
    sqlx::query_scalar(query)
        .fetch_one(&mut *conn)
        .await
        .map_err(error::map)
}

async fn run(conn: &mut SqliteConnection, statements: &[&str]) -> Result<(), LockError> {
    for statement in statements {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .map_err(error::map)?;
    }
    Ok(())
}
