//! What a client checks when it connects: the rows of earlier boots and
//! past their expiry, presence files no row names, and a live grant beyond
//! the file's fence counter (the file restored under a running client).

use std::collections::HashSet;
use std::time::Duration;

use lockcore::LockError;
use sqlx::Row as _;
use sqlx::sqlite::SqliteRow;

use super::Client;
use crate::error::{self, BACKEND, shown};
use crate::fence::LAST_FENCE;
use crate::locks::presence::Presence;
use crate::locks::sql;

impl Client {
    /// Removes rows of earlier boots and past their expiry, and presence
    /// files no row names (left by a holder that died mid-release). Inside
    /// the write lock, so no grant is between creating its file and
    /// committing its row.
    pub(crate) async fn sweep(&self) -> Result<(), LockError> {
        let mut tx = self.begin().await?;
        let now = self.clock.now()?;
        let stale = sqlx::query(sql::STALE)
            .bind(self.clock.boot_id())
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(error::map)?;
        let mut gone = Vec::with_capacity(stale.len());
        for row in &stale {
            let (kind, name, slot, fence): (String, String, i64, i64) = (
                row.try_get(0).map_err(error::map)?,
                row.try_get(1).map_err(error::map)?,
                row.try_get(2).map_err(error::map)?,
                row.try_get(3).map_err(error::map)?,
            );
            sqlx::query(sql::DROP_SLOT)
                .bind(kind)
                .bind(name)
                .bind(slot)
                .bind(fence)
                .execute(&mut *tx)
                .await
                .map_err(error::map)?;
            gone.push(fence as u64);
        }
        if let Some(presence) = &self.presence {
            for fence in presence.fences() {
                let named: Option<SqliteRow> = sqlx::query(sql::EXPIRY_OF)
                    .bind(i64::try_from(fence).unwrap_or(i64::MAX))
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(error::map)?;
                if named.is_none() && !gone.contains(&fence) {
                    presence.remove_if_unlocked(fence);
                }
            }
        }
        tx.commit().await.map_err(error::map)?;
        if let Some(presence) = &self.presence {
            for fence in gone {
                presence.remove(fence);
            }
        }
        Ok(())
    }

    /// Refuses to start on a file whose fence counter is below a grant a
    /// live process still holds (its presence file's `flock`): the file was
    /// replaced while that process ran, and granting would repeat fences and
    /// make two holders. Looked at twice, a moment apart, so a grant of
    /// another process between its file and its commit is not mistaken for
    /// one.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] naming the grant, until that process is
    /// gone (or has noticed, and closed its client) and the floor is raised.
    pub(crate) async fn refuse_holders_beyond_the_counter(&self) -> Result<(), LockError> {
        let Some(presence) = &self.presence else {
            return Ok(());
        };
        let (_, first) = self.held_beyond_the_counter(presence).await?;
        if first.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (last, again) = self.held_beyond_the_counter(presence).await?;
        match again.intersection(&first).min() {
            None => Ok(()),
            Some(fence) => Err(LockError::unavailable(
                BACKEND,
                format!(
                    "a process still holds grant {fence} of {}, beyond the file's fence counter \
                     ({last}): the file was replaced while that process ran (restored from a \
                     backup with clients running); stop every process that uses the lock file, \
                     then raise the fence floor above the highest fence in use \
                     (docs/operations.md, section 5)",
                    shown(&self.path)
                ),
            )),
        }
    }

    /// The fence counter, and the fences above it whose presence files some
    /// process holds.
    async fn held_beyond_the_counter(
        &self,
        presence: &Presence,
    ) -> Result<(u64, HashSet<u64>), LockError> {
        let mut conn = self.read().await?;
        let last: i64 = sqlx::query_scalar(LAST_FENCE)
            .fetch_one(&mut *conn)
            .await
            .map_err(error::map)?;
        drop(conn);
        let last = u64::try_from(last).unwrap_or(0);
        let beyond = (presence.fences().into_iter())
            .filter(|&fence| fence > last && presence.is_held(fence))
            .collect();
        Ok((last, beyond))
    }
}
