//! The fence floor: after a restore, every fence handed out from then on
//! is made larger than the floor (the sequence moved while grants wait).

use lockcore::{FencingToken, LockError};
use sqlx::Connection;

use crate::connection::Client;
use crate::locks::sql;

impl Client {
    /// Makes every fence handed out from now on larger than `floor`, in one
    /// short transaction that holds grants off (the tables of locks,
    /// permits and reader-writer holders locked in EXCLUSIVE mode, reads go
    /// on) while the sequence moves: a `setval`
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
}
