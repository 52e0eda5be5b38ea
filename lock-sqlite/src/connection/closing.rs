//! Closing a client, on request or because its lock file was replaced
//! under it: every lease it granted is lost first (its loss signal fires)
//! and the intents of its waiting writers let go, the clean-ups it owes
//! the store are finished, what it still held is
//! released, then its tasks, inotify instance, connections and presence
//! files are closed, and `close` returns only once they are.

use std::collections::HashSet;

use lockcore::LockError;
use sqlx::SqlitePool;

use super::Client;
use crate::error::{self, BACKEND, shown};
use crate::locks::held::{Closed, Held};
use crate::locks::sql;

impl Client {
    /// Closes this client and returns once every connection, task and file
    /// of it is closed. Idempotent; a concurrent call waits for the first.
    pub(crate) async fn close(&self) {
        let mut done = self.closing.lock().await;
        if *done {
            return;
        }
        let grants = self.grants.close(Closed::ByCall);
        self.intents.close();
        let replaced = matches!(self.grants.closed(), Some(Closed::Replaced(_)));
        if !self.cleanups.finish(self.limit).await {
            tracing::warn!(
                pending = self.cleanups.pending(),
                "clean-ups unfinished at close; what they would undo expires with its TTL"
            );
        }
        // On a replaced file nothing more is written: this client's view of
        // it is one nobody else shares.
        let released = if replaced {
            HashSet::new()
        } else {
            self.release_rows(&grants).await
        };
        self.stop.cancel();
        let tasks = std::mem::take(&mut *self.tasks());
        for task in tasks {
            let _ = task.await;
        }
        if let Some(bells) = &self.bells {
            bells.close().await;
        }
        close_pool(&self.writer).await;
        close_pool(&self.reader).await;
        for (fence, held) in grants {
            let gone = released.contains(&fence);
            self.let_go(fence, held, gone);
        }
        *done = true;
    }

    /// Deletes the rows of `grants` (owner- and fence-checked), in one
    /// transaction; the fences whose rows it deleted. Bounded by the
    /// operation limit: on failure the rows stay, their holder provably
    /// gone once the presence files close.
    async fn release_rows(&self, grants: &[(u64, Held)]) -> HashSet<u64> {
        if grants.is_empty() {
            return HashSet::new();
        }
        let released = lockcore::backend::timed(BACKEND, "release at close", self.limit, async {
            let mut tx = self.begin().await?;
            let mut released = HashSet::new();
            for (fence, held) in grants {
                let row = sqlx::query(sql::RELEASE)
                    .bind(held.kind.as_str())
                    .bind(held.name.as_str())
                    .bind(held.row_slot(*fence))
                    .bind(held.owner.encode())
                    .bind(i64::try_from(*fence).unwrap_or(i64::MAX))
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(error::map)?;
                if row.is_some() {
                    released.insert(*fence);
                }
            }
            tx.commit().await.map_err(error::map)?;
            Ok::<_, LockError>(released)
        })
        .await;
        released.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "releasing at close failed; the locks are free once the presence files close, or at their TTL");
            HashSet::new()
        })
    }

    /// The files were replaced under this client (`what` says how): it is
    /// closed at once, each lease lost and its presence file let go, so
    /// that other processes may take what it held; its connections, whose
    /// view of the file nobody else shares, are closed in the background
    /// (`close` waits for that).
    pub(super) fn replaced(&self, what: String) -> LockError {
        let first = self.grants.closed().is_none();
        for (fence, held) in self.grants.close(Closed::Replaced(what.clone())) {
            self.let_go(fence, held, false);
        }
        self.intents.close();
        if first {
            tracing::warn!(
                path = %shown(&self.path),
                what = %what,
                "the lock file was replaced while this client had it open; closing it, every lease it held is lost"
            );
            if let (Some(me), Ok(runtime)) =
                (self.me.upgrade(), tokio::runtime::Handle::try_current())
            {
                runtime.spawn(async move { me.close().await });
            }
        }
        self.replaced_error(&what)
    }

    pub(super) fn replaced_error(&self, what: &str) -> LockError {
        LockError::unavailable(
            BACKEND,
            format!(
                "{} was replaced while this client had it open ({what}; restored from a backup?): \
                 this client is closed and every lease it held is lost; connect a new one",
                shown(&self.path)
            ),
        )
    }
}

/// Closes every connection of `pool` and returns once they are closed.
/// `Pool::close` (sqlx 0.8) may return while a connection handed back during
/// it is idle and still open (its return pinged the connection past the
/// close's last look at the idle queue); closing again closes those, and
/// then nothing is checked out any more.
async fn close_pool(pool: &SqlitePool) {
    for _ in 0..3 {
        pool.close().await;
        if pool.size() == 0 {
            return;
        }
    }
    tracing::warn!(
        open = pool.size(),
        "connections to the lock file still open after close"
    );
}
