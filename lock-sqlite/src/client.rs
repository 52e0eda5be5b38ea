//! The lock file's client: one function per operation, each write one
//! `BEGIN IMMEDIATE` transaction (a deferred transaction that turns into a
//! write fails with `SQLITE_BUSY` instead of waiting, whatever the busy
//! timeout), each owner- and fence-checked. Renewing a batch is in
//! `renew.rs`, what connect checks in `startup.rs`, closing in
//! `closing.rs`, undoing a grant cut short in `undo.rs`.
//!
//! This file is over 500 lines because every operation shares the same
//! judgement of a row (`Client::is_live`), the same check that the files
//! are still the ones opened (`Client::begin`), and the same bookkeeping of
//! this process's presence files; splitting it would spread one invariant
//! over several files.

mod closing;
mod renew;
mod startup;
mod undo;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::backend::wait::Wakeup;
use lockcore::backend::{CancellationToken, Cleanups, LockRequest, timed};
use lockcore::{
    Attempt, FencingToken, Holder, HolderLabel, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Row as _, Sqlite, Transaction};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::clock::{self, HostClock};
use crate::error::{self, BACKEND, shown};
use crate::files::FileSet;
use crate::held::{Closed, Grants, Held};
use crate::notify::{self, Doorbells};
use crate::presence::{self, FileId, Presence};
use crate::sql;

use undo::Undo;

/// Locks and semaphores live in separate namespaces of one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lock,
    Permit,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Permit => "permit",
        }
    }

    fn of(lease: &Lease) -> Kind {
        if lease.slot().is_some() {
            Kind::Permit
        } else {
            Kind::Lock
        }
    }
}

/// One row of `distlock_leases`.
#[derive(Debug)]
struct Row {
    slot: i64,
    permits: i64,
    owner: String,
    fence: i64,
    label: Option<String>,
    boot_id: String,
    expires_at: i64,
    presence: Option<FileId>,
}

impl Row {
    fn read(row: &SqliteRow) -> Result<Row, LockError> {
        let bad = |e: sqlx::Error| error::corrupt(format!("unreadable lease row: {e}"));
        let dev: Option<i64> = row.try_get(7).map_err(bad)?;
        let ino: Option<i64> = row.try_get(8).map_err(bad)?;
        Ok(Row {
            slot: row.try_get(0).map_err(bad)?,
            permits: row.try_get(1).map_err(bad)?,
            owner: row.try_get(2).map_err(bad)?,
            fence: row.try_get(3).map_err(bad)?,
            label: row.try_get(4).map_err(bad)?,
            boot_id: row.try_get(5).map_err(bad)?,
            expires_at: row.try_get(6).map_err(bad)?,
            presence: dev.zip(ino).map(|(dev, ino)| FileId { dev, ino }),
        })
    }

    fn holder(&self, now: i64) -> Result<Holder, LockError> {
        let fence = FencingToken::from_store(BACKEND, self.fence)?;
        let owner = OwnerToken::decode(&self.owner);
        let label = self.label.as_deref().and_then(|l| HolderLabel::new(l).ok());
        Ok(
            Holder::new(fence, owner, Some(clock::duration(self.expires_at - now)))
                .with_label(label),
        )
    }
}

/// The client of one lock file.
#[derive(Debug)]
pub(crate) struct Client {
    writer: SqlitePool,
    reader: SqlitePool,
    clock: HostClock,
    presence: Option<Presence>,
    bells: Option<Doorbells>,
    /// What it granted, and whether it is closed.
    grants: Grants,
    /// The lock file and its companions as opened.
    files: FileSet,
    path: PathBuf,
    limit: Duration,
    /// Work it owes the store (undoing a grant cut short), which `close`
    /// finishes.
    cleanups: Cleanups,
    /// Ends its own background tasks.
    stop: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Held by `close` while it runs; `true` once it has.
    closing: tokio::sync::Mutex<bool>,
    me: Weak<Client>,
}

type Tx = Transaction<'static, Sqlite>;

/// What a client is made of, opened by `SqliteBackend::with_config`.
pub(crate) struct Parts {
    pub(crate) writer: SqlitePool,
    pub(crate) reader: SqlitePool,
    pub(crate) clock: HostClock,
    pub(crate) presence: Option<Presence>,
    pub(crate) bells: Option<(Doorbells, mpsc::UnboundedReceiver<u64>)>,
    pub(crate) path: PathBuf,
    pub(crate) op_timeout: Duration,
}

impl Client {
    pub(crate) fn new(parts: Parts) -> Arc<Client> {
        let (bells, touched) = parts.bells.unzip();
        let client = Arc::new_cyclic(|me| Client {
            writer: parts.writer,
            reader: parts.reader,
            clock: parts.clock,
            presence: parts.presence,
            bells,
            grants: Grants::default(),
            files: FileSet::record(&parts.path),
            path: parts.path,
            // Waiting for the pool, then for the file's write lock.
            limit: parts.op_timeout * 2 + Duration::from_secs(1),
            cleanups: Cleanups::new(),
            stop: CancellationToken::new(),
            tasks: Mutex::default(),
            closing: tokio::sync::Mutex::new(false),
            me: me.clone(),
        });
        if let Some(touched) = touched {
            let task = tokio::spawn(check_touched(
                Arc::downgrade(&client),
                touched,
                client.stop.clone(),
            ));
            client.tasks().push(task);
        }
        client
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether waiters are woken by the kernel and holders told of evictions.
    pub(crate) fn notifies(&self) -> bool {
        self.bells.is_some()
    }

    /// Refuses work once closed.
    fn open(&self) -> Result<(), LockError> {
        match self.grants.closed() {
            None => Ok(()),
            Some(Closed::ByCall) => Err(LockError::unavailable(
                BACKEND,
                "this client was closed; connect a new one",
            )),
            Some(Closed::Replaced(what)) => Err(self.replaced_error(&what)),
        }
    }

    /// Checks that the files are still the ones this client opened; if not,
    /// closes it (see `files.rs`).
    fn check_files(&self) -> Result<(), LockError> {
        match self.files.replaced() {
            None => Ok(()),
            Some(what) => Err(self.replaced(what)),
        }
    }

    /// A row counts while it is of this boot, unexpired, and its holder is
    /// not provably gone (see `presence.rs`).
    fn is_live(&self, row: &Row, now: i64) -> bool {
        row.boot_id == self.clock.boot_id() && row.expires_at > now && !self.holder_gone(row)
    }

    fn holder_gone(&self, row: &Row) -> bool {
        match (&self.presence, row.presence) {
            (Some(presence), Some(id)) => presence.holder_gone(row.fence as u64, id),
            _ => false,
        }
    }

    /// The file's write lock, on the files this client opened.
    async fn begin(&self) -> Result<Tx, LockError> {
        let tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(error::map)?;
        self.check_files()?;
        Ok(tx)
    }

    /// A reader connection, on the files this client opened.
    async fn read(&self) -> Result<sqlx::pool::PoolConnection<Sqlite>, LockError> {
        let conn = self.reader.acquire().await.map_err(error::map)?;
        self.check_files()?;
        Ok(conn)
    }

    async fn rows(
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

    /// One attempt at a free slot of `kind` `request.name()` out of `permits`.
    pub(crate) async fn try_grant(
        &self,
        kind: Kind,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        self.open()?;
        timed(
            BACKEND,
            "acquire",
            self.limit,
            self.grant(kind, request, permits),
        )
        .await
    }

    async fn grant(
        &self,
        kind: Kind,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        let sent = request.now();
        let mut tx = self.begin().await?;
        let now = self.clock.now()?;
        presence::close_expired(now);
        self.drop_expired(now);
        let rows = Self::rows(&mut tx, kind, request.name()).await?;
        let (live, stale): (Vec<Row>, Vec<Row>) =
            rows.into_iter().partition(|r| self.is_live(r, now));
        if let Some(other) = live.iter().find(|r| r.permits != i64::from(permits)) {
            return Err(LockError::PermitsMismatch {
                name: request.name().clone(),
                requested: permits,
                existing: u32::try_from(other.permits).unwrap_or(u32::MAX),
            });
        }
        let taken: HashSet<i64> = live.iter().map(|r| r.slot).collect();
        let Some(slot) = (0..i64::from(permits)).find(|s| !taken.contains(s)) else {
            let next = live.iter().map(|r| r.expires_at).min().unwrap_or(now);
            return Ok(Attempt::Held {
                expires_in: Some(clock::duration(next - now)),
            });
        };
        for row in &stale {
            sqlx::query(sql::DROP_SLOT)
                .bind(kind.as_str())
                .bind(request.name().as_str())
                .bind(row.slot)
                .bind(row.fence)
                .execute(&mut *tx)
                .await
                .map_err(error::map)?;
        }
        let fence: Option<i64> = sqlx::query_scalar(sql::NEXT_FENCE)
            .fetch_optional(&mut *tx)
            .await
            .map_err(error::map)?;
        let Some(fence) = fence else {
            return Err(LockError::store(
                BACKEND,
                format!(
                    "the fence counter of {} is at its end ({}): no more grants; only a new lock \
                     file (and fenced resources that start over) can help",
                    shown(&self.path),
                    i64::MAX
                ),
            ));
        };
        let token = FencingToken::from_store(BACKEND, fence)?;
        let file = match &self.presence {
            Some(presence) => presence
                .create(token.get())
                .map_err(|_| self.fence_in_use(token))?,
            None => None,
        };
        let owner = OwnerToken::new();
        let expires_at = now.saturating_add(clock::nanos(request.ttl().get()));
        let granted = sqlx::query(sql::GRANT)
            .bind(kind.as_str())
            .bind(request.name().as_str())
            .bind(slot)
            .bind(i64::from(permits))
            .bind(owner.encode())
            .bind(fence)
            .bind(request.label().as_str())
            .bind(self.clock.boot_id())
            .bind(expires_at)
            .bind(file.as_ref().map(|f| f.id.dev))
            .bind(file.as_ref().map(|f| f.id.ino))
            .execute(&mut *tx)
            .await;
        // From here the grant may commit although this future is dropped
        // (a timeout, a cancelled acquire): then it is undone.
        let undo = Undo::arm(
            self,
            kind,
            request.name(),
            slot,
            owner,
            fence,
            request.ttl().get(),
        );
        let committed = match granted {
            Ok(_) => tx.commit().await,
            Err(e) => Err(e),
        };
        undo.disarm();
        if let Err(e) = committed {
            if let (Some(presence), Some(_)) = (&self.presence, &file) {
                presence.remove(token.get());
            }
            return Err(error::map(e));
        }
        self.tidy_stale(&stale);
        let lost = CancellationToken::new();
        let slot = (kind == Kind::Permit).then(|| u32::try_from(slot).unwrap_or(u32::MAX));
        let (path, watch) = match file {
            Some(file) => {
                let watch = self
                    .bells
                    .as_ref()
                    .and_then(|b| b.hold(&file.path, token.get()));
                let path = file.path.clone();
                presence::keep(file, expires_at);
                (Some(path), watch)
            }
            None => (None, None),
        };
        // What `presence_fd` finds the grant's presence file by.
        let presence_of = path.clone().map(presence::PresenceOf);
        let held = Held {
            path,
            kind: kind.as_str(),
            name: request.name().clone(),
            slot,
            owner,
            lost: lost.clone(),
            watch,
            until: expires_at,
        };
        if let Err(held) = self.grants.insert(token.get(), held) {
            // Closed while this grant committed: lost at once, and its
            // presence file let go, so others may take it.
            held.lost.cancel();
            self.let_go(token.get(), held, false);
        }
        let mut lease = Lease::granted(request, owner, token, sent).with_loss_signal(lost);
        if let Some(presence_of) = presence_of {
            lease = lease.with_extension(presence_of);
        }
        Ok(Attempt::Acquired(match slot {
            None => lease,
            Some(slot) => lease.with_slot(slot),
        }))
    }

    /// The next fence's presence file is held by a live process: the
    /// counter went back (a restore), and granting would repeat a fence.
    fn fence_in_use(&self, token: FencingToken) -> LockError {
        LockError::store(
            BACKEND,
            format!(
                "fence {token} of {} is already held by a live process: the fence counter went \
                 back (the file restored from a backup?); raise the fence floor above the highest \
                 fence in use (docs/operations.md, section 5) before granting again",
                shown(&self.path)
            ),
        )
    }

    /// After a commit that replaced expired or dead holders: remove their
    /// presence files, which tells a still-running (paused) holder at once.
    fn tidy_stale(&self, stale: &[Row]) {
        if let Some(presence) = &self.presence {
            for row in stale {
                presence.remove(row.fence as u64);
            }
        }
    }

    /// Forgets our grants whose rows expired by `now`.
    fn drop_expired(&self, now: i64) {
        for (fence, held) in self.grants.expired(now) {
            if let (Some(wd), Some(bells)) = (held.watch, &self.bells) {
                bells.unhold(wd, fence);
            }
        }
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
                .bind(i64::from(lease.slot().unwrap_or(0)))
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
    fn forget(&self, fence: u64, lease: Option<&Lease>, row_gone: bool) {
        match self.grants.remove(fence, lease) {
            Some(held) => self.let_go(fence, held, row_gone),
            None if row_gone => self.remove_presence(fence),
            None => {}
        }
    }

    /// Stops watching grant `fence` and closes its presence file (the
    /// `flock` goes: its holder counts as gone); removes the file when its
    /// row is gone.
    fn let_go(&self, fence: u64, held: Held, row_gone: bool) {
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
                .map(|r| {
                    let holder = r.holder(now)?;
                    Ok(match kind {
                        Kind::Lock => holder,
                        Kind::Permit => holder.with_slot(u32::try_from(r.slot).unwrap_or(u32::MAX)),
                    })
                })
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
            Ok(Some(row.holder(now)?))
        })
        .await
    }

    /// A wake-up for the next change of `kind` `name`: the first change of
    /// any live holder's presence file, at once if a slot is free now, or
    /// `None` if a holder cannot be watched (its waiters then poll).
    pub(crate) async fn watch(
        &self,
        kind: Kind,
        name: &LockName,
    ) -> Result<Option<Wakeup>, LockError> {
        self.open()?;
        let (Some(bells), Some(presence)) = (&self.bells, &self.presence) else {
            return Ok(None);
        };
        let mut conn = self.read().await?;
        let rows = Self::rows(&mut conn, kind, name).await?;
        drop(conn);
        let now = self.clock.now()?;
        let live: Vec<&Row> = rows.iter().filter(|r| self.is_live(r, now)).collect();
        let seats = live.first().map_or(1, |r| r.permits);
        if (live.len() as i64) < seats {
            return Ok(Some(notify::now()));
        }
        let mut wakeups = Vec::with_capacity(live.len());
        for row in live {
            if row.presence.is_none() {
                return Ok(None);
            }
            match bells.ring(&presence.path(row.fence as u64)) {
                Ok(Some(wakeup)) => wakeups.push(wakeup),
                // Gone between the read and the watch: the attempt will see.
                Ok(None) => return Ok(None),
                Err(e) => return Err(LockError::unavailable(BACKEND, e)),
            }
        }
        Ok(Some(notify::first_of(wakeups)))
    }

    /// Raises the fence counter to at least `floor` (checked by the caller).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.open()?;
        timed(BACKEND, "raise_fence_floor", self.limit, async {
            let mut tx = self.begin().await?;
            sqlx::query(sql::RAISE_FLOOR)
                .bind(i64::try_from(floor.get()).unwrap_or(i64::MAX))
                .execute(&mut *tx)
                .await
                .map_err(error::map)?;
            tx.commit().await.map_err(error::map)
        })
        .await
    }

    /// Someone touched the presence file of our grant `fence`: if our row is
    /// gone (evicted, taken over), say so through the lease's loss signal.
    async fn check_held(&self, fence: u64) -> Result<(), LockError> {
        let Some(owner) = self.grants.owner(fence) else {
            return Ok(());
        };
        let mut conn = self.read().await?;
        let row = sqlx::query(sql::HOLDS)
            .bind(i64::try_from(fence).unwrap_or(i64::MAX))
            .bind(owner.encode())
            .fetch_optional(&mut *conn)
            .await
            .map_err(error::map)?;
        drop(conn);
        let now = self.clock.now()?;
        let still = match row {
            Some(row) => {
                let boot: String = row.try_get(0).map_err(error::map)?;
                let expires_at: i64 = row.try_get(1).map_err(error::map)?;
                boot == self.clock.boot_id() && expires_at > now
            }
            None => false,
        };
        if !still {
            self.grants.lose(fence);
            self.forget(fence, None, false);
        }
        Ok(())
    }
}

impl Drop for Client {
    /// A client dropped unclosed still ends its own tasks (its connections
    /// close with their pools; its leases run to their deadlines).
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Checks every touched presence file of ours, until the client is closed
/// or dropped.
async fn check_touched(
    client: Weak<Client>,
    mut touched: mpsc::UnboundedReceiver<u64>,
    stop: CancellationToken,
) {
    loop {
        let fence = tokio::select! {
            _ = stop.cancelled() => return,
            fence = touched.recv() => match fence {
                Some(fence) => fence,
                None => return,
            },
        };
        let Some(client) = client.upgrade() else {
            return;
        };
        let checked = tokio::select! {
            _ = stop.cancelled() => return,
            checked = client.check_held(fence) => checked,
        };
        if let Err(e) = checked {
            tracing::debug!(fence, error = %e, "cannot check a touched presence file; the next renewal will tell");
        }
    }
}

fn fence_of(lease: &Lease) -> i64 {
    i64::try_from(lease.fence().get()).unwrap_or(i64::MAX)
}
