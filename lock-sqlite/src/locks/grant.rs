//! Granting: one attempt at a free slot of a lock or a semaphore, and what
//! every grant shares whatever decided it (a free slot here, the rules of
//! a reader-writer lock in `rw.rs`, every lock of a batch at once in
//! `each.rs`): the write lock and the clock read in it, the judgement of
//! the rows found, the removal of dead and expired ones, and a new row (or
//! several, committed together) with the next fence and a presence file,
//! committed (undone in the background if cut short mid-commit), recorded
//! as this client's and handed out as a lease.

use std::time::Duration;

use lockcore::backend::{CancellationToken, LockRequest, Moment, timed};
use lockcore::{Attempt, FencingToken, Lease, LockError, LockName, OwnerToken};

use super::held::Held;
use super::presence::{self, PresenceFile};
use super::undo::Undo;
use super::{Row, clock, sql};
use crate::connection::{Client, Tx};
use crate::error::{self, BACKEND};
use crate::keys::Kind;

/// A row to write for `request`: of `kind`, in `slot` (`None`: its own
/// fence, for the rows a name has any number of), out of `permits`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewRow<'a> {
    pub(crate) kind: Kind,
    pub(crate) request: &'a LockRequest,
    pub(crate) slot: Option<i64>,
    pub(crate) permits: u32,
}

/// What a name has for one more grant: a free slot (and the stale rows in
/// the way), or none until its first live holder expires.
#[derive(Debug)]
pub(crate) enum Seat {
    Free { slot: i64, stale: Vec<Row> },
    Taken { expires_in: Duration },
}

/// A row written in a grant's transaction, its commit not known yet.
#[derive(Debug)]
struct Staged {
    written: Written,
    /// Armed: dropped before the commit's outcome is known, it undoes the
    /// row.
    undo: Undo,
}

/// A row written and committed.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) fence: i64,
    pub(crate) token: FencingToken,
    pub(crate) owner: OwnerToken,
    pub(crate) slot: i64,
    /// Its presence file, whose `flock` this process holds (`None`: it has
    /// none, and only its expiry frees it).
    pub(crate) file: Option<PresenceFile>,
    pub(crate) expires_at: i64,
}

impl Client {
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
        let (mut tx, now) = self.begin_grant().await?;
        let (slot, stale) = match self
            .seat(&mut tx, kind, request.name(), permits, now)
            .await?
        {
            Seat::Free { slot, stale } => (slot, stale),
            Seat::Taken { expires_in } => {
                return Ok(Attempt::Held {
                    expires_in: Some(expires_in),
                });
            }
        };
        self.drop_rows(&mut tx, kind, request.name(), &stale)
            .await?;
        let row = NewRow {
            kind,
            request,
            slot: Some(slot),
            permits,
        };
        let lease = self.hand_out(tx, row, now, sent).await?;
        self.tidy_stale(&stale);
        Ok(Attempt::Acquired(lease))
    }

    /// Whether `kind` `name` has a free slot out of `permits` at `now`, as
    /// its rows in `tx` say (nothing written).
    pub(crate) async fn seat(
        &self,
        tx: &mut Tx,
        kind: Kind,
        name: &LockName,
        permits: u32,
        now: i64,
    ) -> Result<Seat, LockError> {
        let (live, stale) = self.judge(Self::rows(tx, kind, name).await?, now);
        Ok(match crate::permits::free_slot(name, &live, permits)? {
            Some(slot) => Seat::Free { slot, stale },
            None => {
                let next = live.iter().map(|r| r.expires_at).min().unwrap_or(now);
                Seat::Taken {
                    expires_in: clock::duration(next - now),
                }
            }
        })
    }

    /// The file's write lock and the boot clock read inside it, with this
    /// process's presence files and this client's grants that expired by
    /// then let go.
    pub(crate) async fn begin_grant(&self) -> Result<(Tx, i64), LockError> {
        let tx = self.begin().await?;
        let now = self.clock.now()?;
        presence::close_expired(now);
        self.drop_expired(now);
        Ok((tx, now))
    }

    /// `rows` split into those that count at `now` and the stale ones
    /// (expired, of another boot, their holder provably gone).
    pub(crate) fn judge(&self, rows: Vec<Row>, now: i64) -> (Vec<Row>, Vec<Row>) {
        rows.into_iter().partition(|r| self.is_live(r, now))
    }

    /// Deletes the stale `rows` of `kind` `name` in `tx` (fence-checked);
    /// after the commit, [`tidy_stale`](Self::tidy_stale) removes their
    /// presence files.
    pub(crate) async fn drop_rows(
        &self,
        tx: &mut Tx,
        kind: Kind,
        name: &LockName,
        rows: &[Row],
    ) -> Result<(), LockError> {
        for row in rows {
            sqlx::query(sql::DROP_SLOT)
                .bind(kind.as_str())
                .bind(name.as_str())
                .bind(row.slot)
                .bind(row.fence)
                .execute(&mut **tx)
                .await
                .map_err(error::map)?;
        }
        Ok(())
    }

    /// Writes `row` with the next fence and a presence file in `tx`, and
    /// commits. From the write on, the row may commit although this future
    /// is dropped (a timeout, a cancelled acquire): then it is undone in
    /// the background. On an error its presence file is removed.
    pub(crate) async fn write_row(
        &self,
        mut tx: Tx,
        row: NewRow<'_>,
        now: i64,
    ) -> Result<Written, LockError> {
        let staged = self.stage_row(&mut tx, row, now).await?;
        let committed = tx.commit().await.map_err(error::map);
        let written = self.settle(staged, committed.is_ok());
        committed.map(|()| written)
    }

    /// Writes every row of `rows` as [`write_row`](Self::write_row) writes
    /// one, each with its own fence and presence file, and commits them
    /// together: every row or none. A commit cut short is undone row by row;
    /// on an error every presence file made is removed.
    pub(crate) async fn write_rows(
        &self,
        mut tx: Tx,
        rows: &[NewRow<'_>],
        now: i64,
    ) -> Result<Vec<Written>, LockError> {
        let mut staged = Vec::with_capacity(rows.len());
        let mut outcome = Ok(());
        for row in rows {
            match self.stage_row(&mut tx, *row, now).await {
                Ok(one) => staged.push(one),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        if outcome.is_ok() {
            outcome = tx.commit().await.map_err(error::map);
        }
        let written = (staged.into_iter())
            .map(|one| self.settle(one, outcome.is_ok()))
            .collect();
        // An error drops `tx` uncommitted: nothing was written.
        outcome.map(|()| written)
    }

    /// Writes `row` with the next fence and a presence file in `tx`, not
    /// committed yet: its undo armed from the write on, for a commit that
    /// lands with nobody left to hand the row to. On an error its presence
    /// file is removed.
    async fn stage_row(&self, tx: &mut Tx, row: NewRow<'_>, now: i64) -> Result<Staged, LockError> {
        let fence = self.next_fence(tx).await?;
        let token = FencingToken::from_store(BACKEND, fence)?;
        let file = match &self.presence {
            Some(presence) => presence
                .create_when_free(token.get())
                .await
                .map_err(|_| self.fence_in_use(token))?,
            None => None,
        };
        let owner = OwnerToken::new();
        let slot = row.slot.unwrap_or(fence);
        let ttl: Duration = row.request.ttl().get();
        let expires_at = now.saturating_add(clock::nanos(ttl));
        let access = match row.kind {
            Kind::Rw => row.request.access().map(|a| a.as_str()),
            _ => None,
        };
        let name = row.request.name();
        let inserted = sqlx::query(sql::GRANT)
            .bind(row.kind.as_str())
            .bind(name.as_str())
            .bind(slot)
            .bind(i64::from(row.permits))
            .bind(owner.encode())
            .bind(fence)
            .bind(row.request.label().as_str())
            .bind(self.clock.boot_id())
            .bind(expires_at)
            .bind(file.as_ref().map(|f| f.id.dev))
            .bind(file.as_ref().map(|f| f.id.ino))
            .bind(access)
            .execute(&mut **tx)
            .await;
        let written = Written {
            fence,
            token,
            owner,
            slot,
            file,
            expires_at,
        };
        if let Err(e) = inserted {
            self.drop_file(&written);
            return Err(error::map(e));
        }
        let undo = Undo::arm(self, row.kind, name, slot, owner, fence, ttl);
        Ok(Staged { written, undo })
    }

    /// The commit of `staged` is known: nothing to undo, and its presence
    /// file removed if it did not commit.
    fn settle(&self, staged: Staged, committed: bool) -> Written {
        staged.undo.disarm();
        if !committed {
            self.drop_file(&staged.written);
        }
        staged.written
    }

    /// Removes the presence file `written` made (its row never committed).
    fn drop_file(&self, written: &Written) {
        if let (Some(presence), Some(_)) = (&self.presence, &written.file) {
            presence.remove(written.token.get());
        }
    }

    /// Grants `row` for its request, sent at `sent`: writes it (see
    /// [`write_row`](Self::write_row)) and hands out its lease (see
    /// [`lease_of`](Self::lease_of)).
    pub(crate) async fn hand_out(
        &self,
        tx: Tx,
        row: NewRow<'_>,
        now: i64,
        sent: Moment,
    ) -> Result<Lease, LockError> {
        let written = self.write_row(tx, row, now).await?;
        Ok(self.lease_of(row, written, sent))
    }

    /// Grants every row of `rows` together, each for its request sent at
    /// the same place of `sent` (see [`write_rows`](Self::write_rows)):
    /// their leases in order.
    pub(crate) async fn hand_out_each(
        &self,
        tx: Tx,
        rows: &[NewRow<'_>],
        now: i64,
        sent: &[Moment],
    ) -> Result<Vec<Lease>, LockError> {
        let written = self.write_rows(tx, rows, now).await?;
        Ok((rows.iter().zip(written).zip(sent))
            .map(|((row, written), sent)| self.lease_of(*row, written, *sent))
            .collect())
    }

    /// The lease of `row`, `written` and committed for its request sent at
    /// `sent`: keeps its presence file and an eye on it (its eviction
    /// notice), records it as this client's (its loss signal), with no
    /// wait between the commit and here.
    fn lease_of(&self, row: NewRow<'_>, written: Written, sent: Moment) -> Lease {
        let Written {
            token,
            owner,
            slot,
            file,
            expires_at,
            ..
        } = written;
        let lost = CancellationToken::new();
        let slot = (row.kind == Kind::Permit).then(|| u32::try_from(slot).unwrap_or(u32::MAX));
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
        let request = row.request;
        let held = Held {
            path,
            kind: row.kind,
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
        match slot {
            None => lease,
            Some(slot) => lease.with_slot(slot),
        }
    }

    /// After a commit that replaced expired or dead holders: remove their
    /// presence files, which tells a still-running (paused) holder at once.
    pub(crate) fn tidy_stale(&self, stale: &[Row]) {
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
}
