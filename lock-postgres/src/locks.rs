//! Locks: one function per round trip (acquire, renew, release, inspect,
//! evict, and undoing an acquire whose reply was lost), each on a pooled
//! connection within the operation timeout. `sql.rs` holds every statement
//! of the backend (the permits', the fence floor's and, in `rw/sql.rs`, the
//! reader-writer locks' too: one set, built once from the validated
//! identifiers); `each.rs` takes several locks in one transaction (the
//! acquire statement once per name); `purge.rs` deletes long-free rows.
//! Undoing what a lost reply may have granted is one path for every kind
//! (`undo_later`).

mod each;
mod purge;
pub(crate) mod sql;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{LockRequest, Moment};
use lockcore::{
    Attempt, FencingToken, Holder, HolderLabel, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};
use sqlx::Connection;
use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::QueryAs;
use tokio::time::Instant;
use uuid::Uuid;

use crate::connection::{Client, from_micros, micros, ttl_micros};
use crate::fence::{db_fence, fence_token};
use crate::wait::notify::{Holding, Pending};
use crate::wait::turnstile::HeldTurnstile;
use crate::{error, keys};

/// What a lease of this backend carries: the turnstile it keeps, and its
/// registration for eviction notices.
pub(crate) struct Held {
    pub(crate) turnstile: HeldTurnstile,
    eviction: Holding,
}

/// How an acquire may take a free lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// Whoever waits for it.
    Any,
    /// Only if nobody of any instance waits in the name's turnstile line.
    IfNoLine,
    /// Only if it has been free (or expired) at least this long.
    FreeFor(Duration),
}

/// A row of the acquire statement: `(fence, remaining_us)` (see `Sql::acquire`).
pub(crate) type GrantRow = (Option<i64>, Option<i64>);

impl Client {
    /// One attempt, in one statement, taking a free lock as `take` says.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        request: &LockRequest,
        take: Take,
    ) -> Result<Attempt, LockError> {
        let (name, ttl) = (request.name(), request.ttl());
        let ttl_us = ttl_micros(ttl)?;
        let owner = OwnerToken::new();
        // Counted from before the wait for a connection, on the request's
        // clock: the local deadline may only be early.
        let sent_at = request.now();
        let mut op = self.checkout("acquire").await?;
        // A failover's lock delay (seen by this checkout's new connection,
        // or an earlier one): the name counts as held until it ends.
        if let Some(wait) = self.era.grants_wait() {
            return Ok(Attempt::Held {
                expires_in: Some(wait),
            });
        }
        // Registered before it is sent: an eviction right after the grant
        // must find it.
        let pending = self.wakeups.expect(name.as_str(), owner.as_uuid());
        let rows = match op
            .run(|c| self.grant(request, owner, ttl_us, take).fetch_all(c))
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                if op.in_doubt() {
                    self.forget_later(name, owner, sent_at.mono() + ttl.get());
                }
                return Err(e);
            }
        };
        answered(request, owner, sent_at, pending, &rows)
    }

    /// The acquire statement of `request` by `owner` (`ttl_us`, its TTL in
    /// µs), taking a free lock as `take` says: one per attempt, or one per
    /// name in a multi-lock's transaction.
    fn grant<'q>(
        &'q self,
        request: &'q LockRequest,
        owner: OwnerToken,
        ttl_us: i64,
        take: Take,
    ) -> QueryAs<'q, Postgres, GrantRow, PgArguments> {
        let name = request.name().as_str();
        let free_for_us = match take {
            Take::FreeFor(free_for) => micros(free_for).unwrap_or(i64::MAX).max(1),
            Take::Any | Take::IfNoLine => 0,
        };
        sqlx::query_as(&self.sql.acquire)
            .bind(name)
            .bind(owner.as_uuid())
            .bind(ttl_us)
            .bind(free_for_us)
            .bind(take == Take::IfNoLine)
            .bind(keys::turnstile_key(&self.sql.table, name))
            .bind(request.label().as_str())
    }

    /// Renews `leases` in one statement, each owner-, fence- and
    /// liveness-checked on its own: one result per lease, in order.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let not_held = |lease: &Lease| {
            end_turn(lease);
            Err(LockError::NotHeld {
                name: lease.name().clone(),
            })
        };
        // Where each lease's answer comes from: its position in the batch
        // (a lease given twice is asked about once), or none (not ours).
        let mut asked: HashMap<(Uuid, i64), i64> = HashMap::new();
        let mut batch = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let positions: Vec<Option<i64>> = leases
            .iter()
            .map(|lease| {
                let fence = db_fence(lease.fence())?;
                let ttl_us = micros(lease.ttl().get())?;
                let slot = match lease.slot() {
                    Some(slot) => Some(i32::try_from(slot).ok()?),
                    None => None,
                };
                let key = (lease.owner().as_uuid(), fence);
                Some(*asked.entry(key).or_insert_with(|| {
                    batch.0.push(lease.name().as_str());
                    batch.1.push(key.0);
                    batch.2.push(fence);
                    batch.3.push(ttl_us);
                    batch.4.push(slot);
                    batch.5.push(lease.access().is_some());
                    i64::try_from(batch.0.len()).unwrap_or(i64::MAX)
                }))
            })
            .collect();
        let sent_at = Lease::send_times(leases);
        let renewed: Result<HashSet<i64>, LockError> = async {
            if batch.0.is_empty() {
                return Ok(HashSet::new());
            }
            let mut op = self.checkout("renew").await?;
            let renewed = op
                .run(|c| {
                    sqlx::query_scalar::<_, i64>(&self.sql.renew_many)
                        .bind(&batch.0)
                        .bind(&batch.1)
                        .bind(&batch.2)
                        .bind(&batch.3)
                        .bind(&batch.4)
                        .bind(&batch.5)
                        .fetch_all(c)
                })
                .await?;
            Ok(renewed.into_iter().collect())
        }
        .await;
        match renewed {
            Ok(renewed) => {
                tracing::debug!(
                    leases = leases.len(),
                    renewed = renewed.len(),
                    "renewed a batch"
                );
                leases
                    .iter()
                    .zip(positions)
                    .zip(sent_at)
                    .map(|((lease, at), sent_at)| match at {
                        Some(at) if renewed.contains(&at) => Ok(lease.renewed(sent_at)),
                        _ => not_held(lease),
                    })
                    .collect()
            }
            // Every lease of the batch gets the batch's error.
            Err(e) => {
                let (retryable, message) = (e.is_retryable(), e.to_string());
                leases
                    .iter()
                    .zip(positions)
                    .map(|(lease, at)| match at {
                        None => not_held(lease),
                        Some(_) if retryable => {
                            Err(LockError::unavailable(error::BACKEND, message.clone()))
                        }
                        Some(_) => Err(LockError::store(error::BACKEND, message.clone())),
                    })
                    .collect()
            }
        }
    }

    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        if lease.access().is_some() {
            return self.release_share(lease).await;
        }
        if lease.slot().is_some() {
            return self.release_permit(lease).await;
        }
        let Some(fence) = db_fence(lease.fence()) else {
            end_turn(lease);
            return Ok(ReleaseOutcome::NotHeld);
        };
        let watch = keys::watch_key(&self.sql.table, &keys::lock_topic(lease.name().as_str()));
        let release = || {
            sqlx::query_scalar::<_, i64>(&self.sql.release)
                .bind(lease.name().as_str())
                .bind(lease.owner().as_uuid())
                .bind(fence)
                .bind(&self.sql.channel)
                .bind(watch)
        };
        let outcome = |released: i64| {
            forget_eviction(lease);
            if released == 1 {
                tracing::debug!(lock = %lease.name(), fence = %lease.fence(), "released");
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            }
        };
        // A lease let in by a turnstile still holds it: release on the
        // turnstile's connection, passing the turnstile on at the release's
        // commit, so the next waiter comes in after the row is free, and
        // finds it free. (Not passed, the ticket dropped lets go after.)
        if let Some(mut ticket) = lease
            .extension::<Held>()
            .and_then(|held| held.turnstile.take())
            && let Some(conn) = ticket.connection()
        {
            let passing = sqlx::query_as::<_, (i64, bool)>(&self.sql.release_passing)
                .bind(lease.name().as_str())
                .bind(lease.owner().as_uuid())
                .bind(fence)
                .bind(&self.sql.channel)
                .bind(watch)
                .bind(keys::turnstile_key(&self.sql.table, lease.name().as_str()));
            match error::timed_sql("release", self.op_timeout, passing.fetch_one(conn)).await {
                Ok((released, passed)) => {
                    if passed {
                        ticket.passed_on();
                    }
                    return Ok(outcome(released));
                }
                // The turnstile's connection broke, or the server ended the
                // session: the release runs on its own below (owner-checked,
                // so harmless if the first one did take effect).
                Err(error) => {
                    tracing::debug!(name = %lease.name(), %error, "release on the turnstile's connection failed; releasing alone");
                }
            }
        }
        let mut op = self.checkout("release").await?;
        let released = op.run(|c| release().fetch_one(c)).await?;
        Ok(outcome(released))
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let mut op = self.checkout("inspect").await?;
        let row: Option<HolderRow> = op
            .run(|c| {
                sqlx::query_as(&self.sql.inspect)
                    .bind(name.as_str())
                    .fetch_optional(c)
            })
            .await?;
        row.map(holder).transpose()
    }

    /// Frees `name` (if its holder has fence `expected`, when given), moves
    /// its fence on, and notifies waiters and the evicted holder, in one
    /// short transaction.
    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let sql = &self.sql;
        let mut op = self.checkout("force release").await?;
        op.run(|c| async move {
            let mut tx = c.begin_with(sql::BEGIN).await?;
            let row: Option<HolderRow> = sqlx::query_as(&sql.force_select)
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            let row = row.filter(|(fence, _, _, _)| {
                expected.is_none_or(|expected| u64::try_from(*fence).ok() == Some(expected.get()))
            });
            if let Some((fence, owner, _, _)) = row {
                sqlx::query(&sql.force_free)
                    .bind(name.as_str())
                    .execute(&mut *tx)
                    .await?;
                // Waiters learn the name is free; the evicted holder (if
                // connected) that its grant is gone.
                sqlx::query(sql.notify)
                    .bind(&sql.channel)
                    .bind(name.as_str())
                    .execute(&mut *tx)
                    .await?;
                if let Some(owner) = owner {
                    sqlx::query(sql.notify)
                        .bind(&sql.evict_channel)
                        .bind(format!("{fence} {owner} {}", name.as_str()))
                        .execute(&mut *tx)
                        .await?;
                }
            }
            tx.commit().await?;
            Ok(row)
        })
        .await?
        .map(holder)
        .transpose()
    }

    /// Frees, in the background, what the acquire by `owner` may have got
    /// when its reply was lost (or a grant its waiter will not use: see
    /// `wait.rs`), so the name is not blocked for a whole TTL by a grant
    /// nobody will use. Owner-checked (the owner token belongs to
    /// that one attempt), so it never frees anyone else's grant. Retries
    /// until the server answers, `until` passes (by then the grant has
    /// expired) or the backend is dropped. An acquire still in flight when
    /// the cleanup runs can still grant later; that grant expires.
    pub(crate) fn forget_later(
        self: &Arc<Self>,
        name: &LockName,
        owner: OwnerToken,
        until: Instant,
    ) {
        let name = name.clone();
        let what = "freeing a grant nobody will use";
        self.undo_later(until, what, move |client| {
            let name = name.clone();
            async move { client.forget(&name, owner).await }
        });
    }

    /// Runs `undo` in the background, as one of the client's clean-ups
    /// (`close` finishes them): retried while the server does not answer,
    /// until `until` (when what it undoes has expired anyway) or the
    /// backend is dropped. `undo` answers how many rows it changed.
    pub(crate) fn undo_later<F, Fut>(self: &Arc<Self>, until: Instant, what: &'static str, undo: F)
    where
        F: Fn(Arc<Client>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<i64, LockError>> + Send + 'static,
    {
        self.cleanups
            .retry(self.clone(), until, what, move |client| {
                let undone = undo(client.clone());
                async move {
                    // Closed past its limit for clean-ups: what it undoes expires.
                    if client.pool.is_closed() {
                        return Ok(());
                    }
                    if undone.await? > 0 {
                        tracing::debug!("done {what}");
                    }
                    Ok(())
                }
            });
    }

    /// Frees the grant of `owner` on `name`, if live: how many were freed.
    async fn forget(&self, name: &LockName, owner: OwnerToken) -> Result<i64, LockError> {
        let watch = keys::watch_key(&self.sql.table, &keys::lock_topic(name.as_str()));
        let mut op = self.checkout("cleanup").await?;
        op.run(|c| {
            sqlx::query_scalar::<_, i64>(&self.sql.forget)
                .bind(name.as_str())
                .bind(owner.as_uuid())
                .bind(&self.sql.channel)
                .bind(watch)
                .fetch_one(c)
        })
        .await
    }
}

/// The attempt the acquire statement's `rows` answer, for `request` by
/// `owner` (sent at `sent_at`; `pending`, its eviction registration).
pub(crate) fn answered(
    request: &LockRequest,
    owner: OwnerToken,
    sent_at: Moment,
    pending: Pending,
    rows: &[GrantRow],
) -> Result<Attempt, LockError> {
    Ok(match verdict(rows) {
        Ok(fence) => Attempt::Acquired(granted(request, owner, fence, sent_at, pending)?),
        Err(expires_in) => Attempt::Held { expires_in },
    })
}

/// What the acquire statement's rows say: the fence of a grant, or else
/// the holder's remaining time, if the statement saw the holder.
fn verdict(rows: &[GrantRow]) -> Result<i64, Option<Duration>> {
    // A grant row wins over a holder row (the statement returns one or the
    // other: the snapshot's row is judged live once). No row: a contender
    // is taking the lock right now, or took it after this statement's
    // snapshot (or it has not been free for `free_for`).
    match rows.iter().find_map(|(fence, _)| *fence) {
        Some(fence) => Ok(fence),
        None => Err(rows.iter().find_map(|(_, left)| left.map(from_micros))),
    }
}

/// The lease of `request`'s grant with `fence` (by `owner`, sent at
/// `sent_at`), with its loss signal and eviction registration (`pending`).
fn granted(
    request: &LockRequest,
    owner: OwnerToken,
    fence: i64,
    sent_at: Moment,
    pending: Pending,
) -> Result<Lease, LockError> {
    let token = fence_token(fence)?;
    let (lost, eviction) = pending.granted(fence);
    tracing::debug!(lock = %request.name(), %token, "acquired");
    Ok(Lease::granted(request, owner, token, sent_at)
        .with_loss_signal(lost)
        .with_extension(Held {
            turnstile: HeldTurnstile::default(),
            eviction,
        }))
}

/// Passes on the turnstile `lease` holds, if any (see `wait.rs`).
pub(crate) fn end_turn(lease: &Lease) {
    drop(
        lease
            .extension::<Held>()
            .and_then(|held| held.turnstile.take()),
    );
}

/// Stops watching for the eviction of a lease that was released.
fn forget_eviction(lease: &Lease) {
    if let Some(held) = lease.extension::<Held>() {
        held.eviction.forget();
    }
}

/// A holder as a statement returns it: fence, owner, remaining µs, label.
type HolderRow = (i64, Option<Uuid>, i64, Option<String>);

fn holder((fence, owner, remaining, label): HolderRow) -> Result<Holder, LockError> {
    Ok(Holder::new(
        fence_token(fence)?,
        owner.map(OwnerToken::from_uuid),
        Some(from_micros(remaining)),
    )
    // A label that no longer validates (edited by hand) is no label.
    .with_label(label.and_then(|l| HolderLabel::new(l).ok())))
}
