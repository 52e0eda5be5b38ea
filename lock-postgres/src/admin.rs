//! The operator's side of the store client: raising the fence floor after
//! a restore, and purging rows of names long free.

use std::time::Duration;

use lockcore::{FencingToken, LockError};
use sqlx::Connection;

use crate::client::{Client, micros};
use crate::sql;

impl Client {
    /// Makes every fence handed out from now on larger than `floor`, in one
    /// short transaction that holds grants off (both tables locked in
    /// EXCLUSIVE mode, reads go on) while the sequence moves: a `setval`
    /// racing a grant's `nextval` could hand a fence out twice. The server
    /// gives up waiting for the lock after the operation timeout, so a
    /// queued `LOCK` never holds grants up longer.
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let floor_value = i64::try_from(floor.get()).map_err(|_| {
            LockError::config(format!(
                "fence floor {floor} does not fit PostgreSQL's bigint sequence"
            ))
        })?;
        let begin = format!(
            "{}; SET LOCAL lock_timeout = '{}ms'; {}",
            sql::BEGIN,
            self.op_timeout.as_millis().max(1),
            self.sql.lock_grants
        );
        let mut op = self.checkout("raise fence floor").await?;
        let next: i64 = op
            .run(|c| async move {
                let mut tx = c.begin_with(begin).await?;
                let next = sqlx::query_scalar(&self.sql.floor)
                    .bind(floor_value)
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(next)
            })
            .await?;
        tracing::info!(table = %self.sql.table, %floor, next, "fence floor raised");
        Ok(())
    }

    /// Deletes rows free for at least `older_than`; see
    /// [`PostgresBackend::purge_free`](crate::PostgresBackend::purge_free).
    pub(crate) async fn purge_free(&self, older_than: Duration) -> Result<u64, LockError> {
        let micros = micros(older_than).ok_or_else(|| LockError::InvalidTimeout {
            timeout: older_than,
            reason: "the age does not fit PostgreSQL's interval".into(),
        })?;
        let mut op = self.checkout("purge").await?;
        let purged: i64 = op
            .run(|c| {
                sqlx::query_scalar(&self.sql.purge_free)
                    .bind(micros)
                    .fetch_one(c)
            })
            .await?;
        Ok(u64::try_from(purged).unwrap_or(0))
    }
}
