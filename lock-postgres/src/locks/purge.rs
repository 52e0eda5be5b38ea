//! Purging the rows of names long free (locks and permit slots): released
//! rows are kept so a name's row outlives its holders; a periodic job may
//! delete them when names are many and short-lived. Reader-writer holders
//! and writer intents are deleted when they end: what is left of them
//! expired (a crashed holder, a dead writer) goes too.

use std::time::Duration;

use lockcore::LockError;

use crate::connection::{Client, micros};

impl Client {
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
