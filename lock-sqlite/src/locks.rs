//! Release, inspect and evict of leases (locks, the slots of semaphores
//! and the holders of reader-writer locks, which share their rows and
//! judgement): each write one `BEGIN IMMEDIATE` transaction (a deferred
//! transaction that turns into a write fails with `SQLITE_BUSY` instead of
//! waiting, whatever the busy timeout), each owner- and fence-checked.
//! Granting is in `grant.rs`, every lock of a batch at once in `each.rs`,
//! renewing a batch in `renew.rs`, undoing a grant cut short in `undo.rs`,
//! what this client granted in `held.rs`, setting a lease's remaining time
//! in `remaining.rs`, the holders' presence files in `presence.rs`, the
//! clock leases expire on in `clock.rs`, the statements in `sql.rs`.
//!
//! Every operation here shares the same judgement of a row
//! (`Client::is_live`) and the same bookkeeping of this process's presence
//! files (`forget`, `let_go`).

pub(crate) mod clock;
mod each;
pub(crate) mod grant;
pub(crate) mod held;
pub(crate) mod presence;
mod remaining;
mod renew;
pub(crate) mod sql;
pub(crate) mod undo;

use lockcore::backend::timed;
use lockcore::{
    Access, FencingToken, Holder, HolderLabel, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};
use sqlx::Row as _;
use sqlx::sqlite::SqliteRow;

use crate::connection::Client;
use crate::error::{self, BACKEND};
use crate::keys::{self, Kind};
use held::Held;
use presence::FileId;

/// One row of `distlock_leases`.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) slot: i64,
    pub(crate) permits: i64,
    owner: String,
    pub(crate) fence: i64,
    label: Option<String>,
    boot_id: String,
    pub(crate) expires_at: i64,
    pub(crate) presence: Option<FileId>,
    /// How a reader-writer lock is held (`None` for other kinds).
    pub(crate) access: Option<Access>,
}

impl Row {
    fn read(row: &SqliteRow) -> Result<Row, LockError> {
        let bad = |e: sqlx::Error| error::corrupt(format!("unreadable lease row: {e}"));
        let dev: Option<i64> = row.try_get(7).map_err(bad)?;
        let ino: Option<i64> = row.try_get(8).map_err(bad)?;
        let access: Option<String> = row.try_get(9).map_err(bad)?;
        let access = match access {
            None => None,
            Some(text) => Some(
                Access::parse(&text)
                    .ok_or_else(|| error::corrupt(format!("a lease row with access {text:?}")))?,
            ),
        };
        Ok(Row {
            slot: row.try_get(0).map_err(bad)?,
            permits: row.try_get(1).map_err(bad)?,
            owner: row.try_get(2).map_err(bad)?,
            fence: row.try_get(3).map_err(bad)?,
            label: row.try_get(4).map_err(bad)?,
            boot_id: row.try_get(5).map_err(bad)?,
            expires_at: row.try_get(6).map_err(bad)?,
            presence: dev.zip(ino).map(|(dev, ino)| FileId { dev, ino }),
            access,
        })
    }

    /// The holder of this row of `kind`: a permit with its slot, a
    /// reader-writer holder with its access.
    fn holder(&self, kind: Kind, now: i64) -> Result<Holder, LockError> {
        let fence = FencingToken::from_store(BACKEND, self.fence)?;
        let owner = OwnerToken::decode(&self.owner);
        let label = self.label.as_deref().and_then(|l| HolderLabel::new(l).ok());
        let holder = Holder::new(fence, owner, Some(clock::duration(self.expires_at - now)))
            .with_label(label);
        Ok(match (kind, self.access) {
            (Kind::Permit, _) => holder.with_slot(u32::try_from(self.slot).unwrap_or(u32::MAX)),
            (_, Some(access)) => holder.with_access(access),
            _ => holder,
        })
    }
}

impl Client {
    /// A row counts while it is of this boot, unexpired, and its holder is
    /// not provably gone (see `presence.rs`).
    pub(crate) fn is_live(&self, row: &Row, now: i64) -> bool {
        row.boot_id == self.clock.boot_id() && row.expires_at > now && !self.holder_gone(row)
    }

    fn holder_gone(&self, row: &Row) -> bool {
        match (&self.presence, row.presence) {
            (Some(presence), Some(id)) => presence.holder_gone(row.fence as u64, id),
            _ => false,
        }
    }

    pub(crate) async fn rows(
        conn: &mut sqlx::SqliteConnection,
        kind: Kind,
        name: &LockName,
    ) -> Result<Vec<Row>, LockError> {
        sqlx::query(sql::ROWS)
            .bind(kind.as_str())
            .bind(name.as_str())
            .fetch_all(conn)
            .await
            .map_err(error::map)?
            .iter()
            .map(Row::read)
            .collect()
    }

    /// Releases `lease` if this owner still holds it.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.open()?;
        timed(BACKEND, "release", self.limit, async {
            let mut tx = self.begin().await?;
            let now = self.clock.now()?;
            let row = sqlx::query(sql::RELEASE)
                .bind(Kind::of(lease).as_str())
                .bind(lease.name().as_str())
                .bind(keys::slot_of(lease))
                .bind(lease.owner().encode())
                .bind(fence_of(lease))
                .fetch_optional(&mut *tx)
                .await
                .map_err(error::map)?;
            tx.commit().await.map_err(error::map)?;
            let was_live = match &row {
                Some(row) => {
                    let boot: String = row.try_get(0).map_err(error::map)?;
                    let expires_at: i64 = row.try_get(1).map_err(error::map)?;
                    boot == self.clock.boot_id() && expires_at > now
                }
                None => false,
            };
            self.forget(lease.fence().get(), Some(lease), row.is_some());
            Ok(if was_live {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            })
        })
        .await
    }

    /// The grant `fence` ended for this process: stop watching it and close
    /// its presence file if it is `lease`'s grant made here (any lease when
    /// `None`; a forged lease touches nothing), or whoever made it when
    /// `row_gone` (its row was deleted); with `row_gone`, also remove the
    /// file, which wakes waiters.
    pub(crate) fn forget(&self, fence: u64, lease: Option<&Lease>, row_gone: bool) {
        match self.grants.remove(fence, lease) {
            Some(held) => self.let_go(fence, held, row_gone),
            None if row_gone => self.remove_presence(fence),
            None => {}
        }
    }

    /// Stops watching grant `fence` and closes its presence file (the
    /// `flock` goes: its holder counts as gone); removes the file when its
    /// row is gone.
    pub(crate) fn let_go(&self, fence: u64, held: Held, row_gone: bool) {
        if let (Some(wd), Some(bells)) = (held.watch, &self.bells) {
            bells.unhold(wd, fence);
        }
        if let Some(path) = &held.path {
            presence::unkeep(path);
        }
        if row_gone {
            self.remove_presence(fence);
        }
    }

    /// Closes (if this process keeps it) and removes the presence file of
    /// `fence`, whose row is gone.
    fn remove_presence(&self, fence: u64) {
        if let Some(presence) = &self.presence {
            // Closing drops the flock; waiters wake on the close and the removal.
            presence::unkeep(&presence.path(fence));
            presence.remove(fence);
        }
    }

    /// The live holders of `kind` `name`.
    pub(crate) async fn holders(
        &self,
        kind: Kind,
        name: &LockName,
    ) -> Result<Vec<Holder>, LockError> {
        self.open()?;
        timed(BACKEND, "inspect", self.limit, async {
            let mut conn = self.read().await?;
            let rows = Self::rows(&mut conn, kind, name).await?;
            let now = self.clock.now()?;
            rows.iter()
                .filter(|r| self.is_live(r, now))
                .map(|r| r.holder(kind, now))
                .collect()
        })
        .await
    }

    /// Evicts the live holder of lock `name` (only the one with `expected`).
    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.open()?;
        timed(BACKEND, "evict", self.limit, async {
            let mut tx = self.begin().await?;
            let now = self.clock.now()?;
            let rows = Self::rows(&mut tx, Kind::Lock, name).await?;
            let Some(row) = rows.into_iter().find(|r| {
                self.is_live(r, now) && expected.is_none_or(|f| f.get() as i64 == r.fence)
            }) else {
                return Ok(None);
            };
            sqlx::query(sql::DROP_SLOT)
                .bind(Kind::Lock.as_str())
                .bind(name.as_str())
                .bind(row.slot)
                .bind(row.fence)
                .execute(&mut *tx)
                .await
                .map_err(error::map)?;
            tx.commit().await.map_err(error::map)?;
            let fence = row.fence as u64;
            // A holder in this process hears it directly; one elsewhere, and
            // every waiter, through the presence file's removal.
            self.grants.lose(fence);
            self.forget(fence, None, true);
            Ok(Some(row.holder(Kind::Lock, now)?))
        })
        .await
    }
}

/// The fence as the file stores it (an INTEGER).
pub(crate) fn fence_of(lease: &Lease) -> i64 {
    i64::try_from(lease.fence().get()).unwrap_or(i64::MAX)
}
