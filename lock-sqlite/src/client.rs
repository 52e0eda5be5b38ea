//! The lock file's client: one function per operation, each write one
//! `BEGIN IMMEDIATE` transaction (a deferred transaction that turns into a
//! write fails with `SQLITE_BUSY` instead of waiting, whatever the busy
//! timeout), each owner- and fence-checked.
//!
//! This file is over 400 lines because every operation shares the same
//! judgement of a row (`Client::is_live`) and the same bookkeeping of this
//! process's presence files; splitting it would spread one invariant over
//! several files.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use lockcore::backend::{CancellationToken, LockRequest, Moment, Wakeup, timed};
use lockcore::{
    Attempt, FencingToken, Holder, HolderLabel, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Row as _, Sqlite, Transaction};
use tokio::sync::mpsc;

use crate::clock::{self, HostClock};
use crate::error::{self, BACKEND};
use crate::notify::{self, Doorbells};
use crate::presence::{self, FileId, Presence, Renewing};
use crate::sql;

/// Leases renewed by one statement (bounds the JSON of one batch).
const RENEW_CHUNK: usize = 1000;

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

/// A grant this backend made and still watches: its presence file, owner
/// and loss signal.
#[derive(Debug)]
struct Held {
    /// The presence file, kept in `presence::KEPT`.
    path: PathBuf,
    name: LockName,
    slot: Option<u32>,
    owner: OwnerToken,
    lost: CancellationToken,
    watch: Option<i32>,
}

/// The client of one lock file.
#[derive(Debug)]
pub(crate) struct Client {
    writer: SqlitePool,
    reader: SqlitePool,
    clock: HostClock,
    presence: Option<Presence>,
    bells: Option<Doorbells>,
    held: Mutex<HashMap<u64, Held>>,
    limit: Duration,
}

type Tx = Transaction<'static, Sqlite>;

impl Client {
    pub(crate) fn new(
        writer: SqlitePool,
        reader: SqlitePool,
        clock: HostClock,
        presence: Option<Presence>,
        bells: Option<(Doorbells, mpsc::UnboundedReceiver<u64>)>,
        op_timeout: Duration,
    ) -> Arc<Client> {
        let (bells, touched) = bells.unzip();
        let client = Arc::new(Client {
            writer,
            reader,
            clock,
            presence,
            bells,
            held: Mutex::default(),
            // Waiting for the pool, then for the file's write lock.
            limit: op_timeout * 2 + Duration::from_secs(1),
        });
        if let Some(touched) = touched {
            tokio::spawn(check_touched(Arc::downgrade(&client), touched));
        }
        client
    }

    /// Whether waiters are woken by the kernel and holders told of evictions.
    pub(crate) fn notifies(&self) -> bool {
        self.bells.is_some()
    }

    fn held(&self) -> MutexGuard<'_, HashMap<u64, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
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

    async fn begin(&self) -> Result<Tx, LockError> {
        self.writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(error::map)
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
        let sent = Moment::now();
        let mut tx = self.begin().await?;
        let now = self.clock.now()?;
        presence::close_expired(now);
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
        let fence: i64 = sqlx::query_scalar(sql::NEXT_FENCE)
            .fetch_one(&mut *tx)
            .await
            .map_err(error::map)?;
        let token = FencingToken::from_store(BACKEND, fence)?;
        let file = self.presence.as_ref().and_then(|p| p.create(token.get()));
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
        let committed = match granted {
            Ok(_) => tx.commit().await,
            Err(e) => Err(e),
        };
        if let Err(e) = committed {
            if let (Some(presence), Some(_)) = (&self.presence, &file) {
                presence.remove(token.get());
            }
            return Err(error::map(e));
        }
        self.tidy_stale(&stale);
        let lost = CancellationToken::new();
        let mut kept_path = None;
        if let Some(file) = file {
            let watch = self
                .bells
                .as_ref()
                .and_then(|b| b.hold(&file.path, token.get()));
            let path = file.path.clone();
            kept_path = Some(path.clone());
            presence::keep(file, expires_at);
            self.held().insert(
                token.get(),
                Held {
                    path,
                    name: request.name().clone(),
                    slot: (kind == Kind::Permit).then(|| u32::try_from(slot).unwrap_or(u32::MAX)),
                    owner,
                    lost: lost.clone(),
                    watch,
                },
            );
        }
        let mut lease = Lease::new(request.name().clone(), owner, token, request.ttl(), sent)
            .with_loss_signal(lost);
        if let Some(path) = kept_path {
            lease = lease.with_extension(presence::PresenceOf(path));
        }
        Ok(Attempt::Acquired(match kind {
            Kind::Lock => lease,
            Kind::Permit => lease.with_slot(u32::try_from(slot).unwrap_or(u32::MAX)),
        }))
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

    /// Renews every lease in one transaction, [`RENEW_CHUNK`] per statement.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        match timed(BACKEND, "renew", self.limit, self.renew_all(leases)).await {
            Ok(results) => results,
            Err(e) => leases.iter().map(|_| Err(copy(&e))).collect(),
        }
    }

    async fn renew_all(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Lease, LockError>>, LockError> {
        // Before the clock is read: no presence file closes while a renewal
        // may be moving its expiry.
        let renewing: Vec<Option<Renewing>> = leases
            .iter()
            .map(|l| {
                self.presence
                    .as_ref()
                    .map(|p| Renewing::start(p.path(l.fence().get())))
            })
            .collect();
        let sent = Moment::now();
        let mut tx = self.begin().await?;
        let now = self.clock.now()?;
        // Fence (unique per grant) → the expiry its row was renewed to.
        let mut renewed: HashMap<i64, i64> = HashMap::with_capacity(leases.len());
        for chunk in leases.chunks(RENEW_CHUNK) {
            let batch: Vec<serde_json::Value> = (chunk.iter())
                .map(|lease| {
                    serde_json::json!([
                        now.saturating_add(clock::nanos(lease.ttl())),
                        Kind::of(lease).as_str(),
                        lease.name().as_str(),
                        i64::from(lease.slot().unwrap_or(0)),
                        lease.owner().encode(),
                        fence_of(lease),
                    ])
                })
                .collect();
            let rows: Vec<(i64, i64)> = sqlx::query_as(sql::RENEW)
                .bind(serde_json::Value::Array(batch).to_string())
                .bind(self.clock.boot_id())
                .bind(now)
                .fetch_all(&mut *tx)
                .await
                .map_err(error::map)?;
            renewed.extend(rows);
        }
        tx.commit().await.map_err(error::map)?;
        let results: Vec<Result<Lease, LockError>> = (leases.iter().zip(&renewing))
            .map(|(lease, renewing)| match renewed.get(&fence_of(lease)) {
                Some(&at) => {
                    if let Some(renewing) = renewing {
                        renewing.extended(at);
                    }
                    Ok(lease.renewed(sent))
                }
                None => Err(LockError::NotHeld {
                    name: lease.name().clone(),
                }),
            })
            .collect();
        for (lease, result) in leases.iter().zip(&results) {
            if result.is_err() {
                self.forget(lease.fence().get(), Some(lease), false);
            }
        }
        Ok(results)
    }

    /// Releases `lease` if this owner still holds it.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
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
    /// `None`), or whoever made it when `row_gone` (its row was deleted);
    /// with `row_gone`, also remove the file, which wakes waiters.
    fn forget(&self, fence: u64, lease: Option<&Lease>, row_gone: bool) {
        let ours = {
            let mut held = self.held();
            // A forged lease (another owner, name or slot with this fence)
            // touches nothing.
            let same = |h: &Held| {
                lease.is_none_or(|l| {
                    l.owner() == h.owner && l.name() == &h.name && l.slot() == h.slot
                })
            };
            match held.get(&fence) {
                Some(h) if same(h) => held.remove(&fence),
                _ => None,
            }
        };
        if let (Some(held), Some(bells)) = (&ours, &self.bells)
            && let Some(wd) = held.watch
        {
            bells.unhold(wd, fence);
        }
        if let Some(presence) = &self.presence
            && (ours.is_some() || row_gone)
        {
            // Closing drops the flock; waiters wake on the close and the removal.
            presence::unkeep(&presence.path(fence));
            if row_gone {
                presence.remove(fence);
            }
        }
    }

    /// The live holders of `kind` `name`.
    pub(crate) async fn holders(
        &self,
        kind: Kind,
        name: &LockName,
    ) -> Result<Vec<Holder>, LockError> {
        timed(BACKEND, "inspect", self.limit, async {
            let mut conn = self.reader.acquire().await.map_err(error::map)?;
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
            if let Some(held) = self.held().get(&fence) {
                held.lost.cancel();
            }
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
        let (Some(bells), Some(presence)) = (&self.bells, &self.presence) else {
            return Ok(None);
        };
        let mut conn = self.reader.acquire().await.map_err(error::map)?;
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

    /// Raises the fence counter to at least `floor`.
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
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

    /// Someone touched the presence file of our grant `fence`: if our row is
    /// gone (evicted, taken over), say so through the lease's loss signal.
    async fn check_held(&self, fence: u64) -> Result<(), LockError> {
        let Some(owner) = self.held().get(&fence).map(|h| h.owner) else {
            return Ok(());
        };
        let mut conn = self.reader.acquire().await.map_err(error::map)?;
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
            if let Some(held) = self.held().get(&fence) {
                held.lost.cancel();
            }
            self.forget(fence, None, false);
        }
        Ok(())
    }

    /// Closes both pools and every presence file, as a dying process would.
    pub(crate) async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
        let held: Vec<Held> = self.held().drain().map(|(_, held)| held).collect();
        for held in held {
            presence::unkeep(&held.path);
        }
    }
}

/// Checks every touched presence file of ours, until the client is dropped.
async fn check_touched(client: Weak<Client>, mut touched: mpsc::UnboundedReceiver<u64>) {
    while let Some(fence) = touched.recv().await {
        let Some(client) = client.upgrade() else {
            return;
        };
        if let Err(e) = client.check_held(fence).await {
            tracing::debug!(fence, error = %e, "cannot check a touched presence file; the next renewal will tell");
        }
    }
}

fn fence_of(lease: &Lease) -> i64 {
    i64::try_from(lease.fence().get()).unwrap_or(i64::MAX)
}

/// The same error again, for every lease of a failed batch.
fn copy(e: &LockError) -> LockError {
    if e.is_retryable() {
        LockError::unavailable(BACKEND, e.to_string())
    } else {
        LockError::store(BACKEND, e.to_string())
    }
}
