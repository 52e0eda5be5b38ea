//! The store client for semaphores: one short transaction per grant, one
//! statement per renew, release or look, on the permits table (one row per
//! slot).

use std::sync::Arc;

use lockcore::backend::LockRequest;
use lockcore::{
    Attempt, Holder, HolderLabel, Lease, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use sqlx::Connection;
use tokio::time::Instant;
use uuid::Uuid;

use crate::connection::{Client, from_micros, ttl_micros};
use crate::fence::{db_fence, fence_token};
use crate::locks::sql;
use crate::{error, keys};

/// A taken slot as `permit_inspect` returns it: slot, fence, owner,
/// remaining µs, label.
type SlotRow = (i32, i64, Option<Uuid>, i64, Option<String>);

/// What `permit_take` answers: slot and fence when granted, the count live
/// holders agreed on when it differs, the time to the first expiry.
type TakeRow = (Option<i32>, Option<i64>, Option<i32>, Option<i64>);

impl Client {
    /// One attempt at a slot of the `permits`-slot semaphore `request.name()`:
    /// the grant runs under the semaphore's advisory lock, so grants of one
    /// semaphore see each other (at most `permits` holders, one count).
    pub(crate) async fn try_acquire_permit(
        self: &Arc<Self>,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        let name = request.name();
        let count = i32::try_from(permits)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                LockError::config(format!(
                    "semaphore \"{name}\" needs from 1 to {} permits, not {permits}",
                    i32::MAX
                ))
            })?;
        let ttl = request.ttl();
        let ttl_us = ttl_micros(ttl)?;
        let owner = OwnerToken::new();
        let begin = sql::begin_locked(keys::permits_key(&self.sql.table, name.as_str()));
        let sent_at = request.now();
        let mut op = self.checkout("acquire permit").await?;
        if let Some(wait) = self.era.grants_wait() {
            return Ok(Attempt::Held {
                expires_in: Some(wait),
            });
        }
        let taken: Result<TakeRow, LockError> = op
            .run(|c| async move {
                let mut tx = c.begin_with(begin).await?;
                let row = sqlx::query_as(&self.sql.permit_take)
                    .bind(name.as_str())
                    .bind(owner.as_uuid())
                    .bind(count)
                    .bind(ttl_us)
                    .bind(request.label().as_str())
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(row)
            })
            .await;
        let (slot, fence, existing, remaining) = match taken {
            Ok(row) => row,
            Err(e) => {
                // The commit may have happened without its answer: a slot
                // taken for nobody, freed once the server answers again.
                if op.in_doubt() {
                    self.forget_permit_later(name, owner, sent_at.mono() + ttl.get());
                }
                return Err(e);
            }
        };
        if let (Some(slot), Some(fence)) = (slot, fence) {
            let token = fence_token(fence)?;
            let slot = u32::try_from(slot)
                .map_err(|_| error::corrupt(format!("the permits table holds slot {slot}")))?;
            tracing::debug!(semaphore = %name, slot, %token, "permit acquired");
            return Ok(Attempt::Acquired(
                Lease::granted(request, owner, token, sent_at)
                    .with_slot(slot)
                    .with_loss_signal(self.era.loss_signal()),
            ));
        }
        if let Some(existing) = existing {
            return Err(LockError::PermitsMismatch {
                name: name.clone(),
                requested: permits,
                existing: u32::try_from(existing).unwrap_or(0),
            });
        }
        Ok(Attempt::Held {
            expires_in: remaining.map(from_micros),
        })
    }

    pub(crate) async fn release_permit(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let (Some(fence), Some(slot)) = (
            db_fence(lease.fence()),
            lease.slot().and_then(|s| i32::try_from(s).ok()),
        ) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let topic = keys::permits_topic(lease.name().as_str());
        let watch = keys::watch_key(&self.sql.table, &topic);
        let mut op = self.checkout("release permit").await?;
        let released: i64 = op
            .run(|c| {
                sqlx::query_scalar(&self.sql.permit_release)
                    .bind(lease.name().as_str())
                    .bind(slot)
                    .bind(lease.owner().as_uuid())
                    .bind(fence)
                    .bind(&self.sql.channel)
                    .bind(&topic)
                    .bind(watch)
                    .fetch_one(c)
            })
            .await?;
        Ok(if released == 1 {
            tracing::debug!(semaphore = %lease.name(), slot, "permit released");
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Frees, in the background (a clean-up `close` finishes), the slot the
    /// permit acquire by `owner` may have taken when its reply was lost, as
    /// `forget_later` does for locks: owner-checked, retried until the
    /// server answers or `until` passes (the slot has expired by then).
    fn forget_permit_later(self: &Arc<Self>, name: &LockName, owner: OwnerToken, until: Instant) {
        let name = name.clone();
        let what = "freeing the slot of a permit acquire whose reply was lost";
        self.undo_later(until, what, move |client| {
            let name = name.clone();
            async move { client.forget_permit(&name, owner).await }
        });
    }

    /// Frees the live slot of `owner` in the semaphore `name`, if any (the
    /// owner token belongs to one attempt): how many were freed.
    async fn forget_permit(&self, name: &LockName, owner: OwnerToken) -> Result<i64, LockError> {
        let topic = keys::permits_topic(name.as_str());
        let watch = keys::watch_key(&self.sql.table, &topic);
        let mut op = self.checkout("cleanup").await?;
        op.run(|c| {
            sqlx::query_scalar::<_, i64>(&self.sql.permit_forget)
                .bind(name.as_str())
                .bind(owner.as_uuid())
                .bind(&self.sql.channel)
                .bind(&topic)
                .bind(watch)
                .fetch_one(c)
        })
        .await
    }

    /// The live holders of the semaphore `name`, one per taken slot.
    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let mut op = self.checkout("inspect permits").await?;
        let rows: Vec<SlotRow> = op
            .run(|c| {
                sqlx::query_as(&self.sql.permit_inspect)
                    .bind(name.as_str())
                    .fetch_all(c)
            })
            .await?;
        rows.into_iter()
            .map(|(slot, fence, owner, remaining, label)| {
                Ok(Holder::new(
                    fence_token(fence)?,
                    owner.map(OwnerToken::from_uuid),
                    Some(from_micros(remaining)),
                )
                .with_slot(u32::try_from(slot).unwrap_or(0))
                .with_label(label.and_then(|l| HolderLabel::new(l).ok())))
            })
            .collect()
    }
}
