//! The fence counter of the lock file: one per file, so fences never
//! repeat across names and slots; the next fence of a grant, the fence
//! floor (`raise_fence_floor`, after a restore), and the refusal to reuse a
//! fence a live process still holds. Fencing the resource a lock protects
//! (`fenced_write`) is in `resource.rs`.

pub(crate) mod resource;

use lockcore::backend::timed;
use lockcore::{FencingToken, LockError};

use crate::connection::{Client, Tx};
use crate::error::{self, BACKEND, shown};

/// The next fence; no row once the counter is at `i64::MAX` (SQLite would
/// turn `last + 1` into a float).
const NEXT_FENCE: &str = "UPDATE distlock_fence SET last = last + 1 WHERE id = 1 AND last < 9223372036854775807 RETURNING last";

/// The last fence handed out (or the floor).
pub(crate) const LAST_FENCE: &str = "SELECT last FROM distlock_fence WHERE id = 1";

/// Raises the counter to at least `?1`.
const RAISE_FLOOR: &str = "UPDATE distlock_fence SET last = max(last, ?1) WHERE id = 1";

impl Client {
    /// The next fence, taken in the grant's transaction `tx`.
    pub(crate) async fn next_fence(&self, tx: &mut Tx) -> Result<i64, LockError> {
        let fence: Option<i64> = sqlx::query_scalar(NEXT_FENCE)
            .fetch_optional(&mut **tx)
            .await
            .map_err(error::map)?;
        fence.ok_or_else(|| {
            LockError::store(
                BACKEND,
                format!(
                    "the fence counter of {} is at its end ({}): no more grants; only a new lock \
                     file (and fenced resources that start over) can help",
                    shown(self.path()),
                    i64::MAX
                ),
            )
        })
    }

    /// The next fence's presence file is held by a live process: the
    /// counter went back (a restore), and granting would repeat a fence.
    pub(crate) fn fence_in_use(&self, token: FencingToken) -> LockError {
        LockError::store(
            BACKEND,
            format!(
                "fence {token} of {} is already held by a live process: the fence counter went \
                 back (the file restored from a backup?); raise the fence floor above the highest \
                 fence in use (docs/operations.md, section 5) before granting again",
                shown(self.path())
            ),
        )
    }

    /// Raises the fence counter to at least `floor` (checked by the caller).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.open()?;
        timed(BACKEND, "raise_fence_floor", self.limit, async {
            let mut tx = self.begin().await?;
            sqlx::query(RAISE_FLOOR)
                .bind(i64::try_from(floor.get()).unwrap_or(i64::MAX))
                .execute(&mut *tx)
                .await
                .map_err(error::map)?;
            tx.commit().await.map_err(error::map)
        })
        .await
    }
}
