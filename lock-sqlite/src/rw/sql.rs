//! The statement of reader-writer locks of their own: every other one
//! (reading, granting, releasing, renewing a holder, removing an intent) is
//! the leases' (`locks/sql.rs`), on rows of kinds `rw` and `intent`.

/// Moves the expiry of a waiting writer's intent to `?1`, if it is still
/// there, this boot's, and unexpired: `?2` name, `?3` its fence (also its
/// slot), `?4` owner, `?5` boot id, `?6` now. Returns the row when moved.
pub(crate) const REFRESH_INTENT: &str = "
UPDATE distlock_leases SET expires_at = ?1
WHERE kind = 'intent' AND name = ?2 AND slot = ?3 AND fence = ?3 AND owner = ?4
  AND boot_id = ?5 AND expires_at > ?6
RETURNING fence";
