//! The store client for reader-writer locks: one short transaction per
//! grant, one statement per renew (in the lock table's batch), release,
//! forget, intent removal or look. The holders table keeps one row per
//! holder (`<table>_rw`), the intents table one row per waiting writer
//! (`<table>_rw_intent`); `sql.rs` holds their statements, `wait.rs` the
//! wait (a writer's intent included).
//!
//! A grant runs under the name's advisory lock (`keys::rw_key`), as a
//! permit's does under its semaphore's: grants of one name see each other,
//! so a reader and a writer racing can never both win. Fences come from the
//! lock table's sequence, like every other grant's.

pub(crate) mod sql;
mod wait;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use lockcore::backend::LockRequest;
use lockcore::{
    Access, Attempt, Holder, HolderLabel, Lease, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use sqlx::Connection;
use tokio::time::Instant;
use uuid::Uuid;

pub(crate) use self::wait::wait;
use crate::connection::{Client, from_micros, ttl_micros};
use crate::fence::{db_fence, fence_token};
use crate::locks::sql::begin_locked;
use crate::{error, keys};

/// A holder as `inspect` returns it: owner, access, fence, remaining µs,
/// label.
type ShareRow = (Uuid, String, i64, i64, Option<String>);

/// The intents this client's waiting writers may have in the store (from
/// the moment an attempt that may leave one is sent until the intent is
/// known gone), by id: `close` removes those its clean-ups did not.
#[derive(Default)]
pub(crate) struct Intents(Mutex<HashMap<Uuid, LockName>>);

impl Intents {
    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, LockName>> {
        // Single map operations: a panic cannot leave it torn.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Client {
    /// One attempt at `access` of the reader-writer lock `request.name()`.
    /// `intent`: the waiting writer's, left (or refreshed) in the store when
    /// the write is refused, removed with its grant.
    pub(crate) async fn try_share(
        self: &Arc<Self>,
        request: &LockRequest,
        access: Access,
        intent: Option<Uuid>,
    ) -> Result<Attempt, LockError> {
        let (name, ttl) = (request.name(), request.ttl());
        let ttl_us = ttl_micros(ttl)?;
        let owner = OwnerToken::new();
        let begin = begin_locked(keys::rw_key(&self.sql.table, name.as_str()));
        let sent_at = request.now();
        let mut op = self.checkout("acquire reader-writer lock").await?;
        if let Some(wait) = self.era.grants_wait() {
            return Ok(Attempt::Held {
                expires_in: Some(wait),
            });
        }
        if let Some(id) = intent {
            self.intents.lock().insert(id, name.clone());
        }
        let taken: Result<(Option<i64>, Option<i64>), LockError> = op
            .run(|c| async move {
                let mut tx = c.begin_with(begin).await?;
                let row = sqlx::query_as(&self.sql.rw.take)
                    .bind(name.as_str())
                    .bind(owner.as_uuid())
                    .bind(access.as_str())
                    .bind(ttl_us)
                    .bind(request.label().as_str())
                    .bind(intent)
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(row)
            })
            .await;
        let (fence, remaining) = match taken {
            Ok(row) => row,
            Err(e) => {
                // The commit may have happened without its answer: a share
                // held for nobody, removed once the server answers again.
                if op.in_doubt() {
                    self.forget_share_later(name, owner, sent_at.mono() + ttl.get());
                }
                return Err(e);
            }
        };
        if let Some(fence) = fence {
            // The grant removed the intent.
            if let Some(id) = intent {
                self.intents.lock().remove(&id);
            }
            let token = fence_token(fence)?;
            tracing::debug!(rw_lock = %name, %access, %token, "acquired");
            return Ok(Attempt::Acquired(
                Lease::granted(request, owner, token, sent_at)
                    .with_loss_signal(self.era.loss_signal()),
            ));
        }
        Ok(Attempt::Held {
            expires_in: remaining.map(from_micros),
        })
    }

    /// Releases a share, owner- and fence-checked, waking the name's
    /// waiters if some wait.
    pub(crate) async fn release_share(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let Some(fence) = db_fence(lease.fence()) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let (topic, watch) = self.rw_topic(lease.name());
        let mut op = self.checkout("release reader-writer lock").await?;
        let released: i64 = op
            .run(|c| {
                sqlx::query_scalar(&self.sql.rw.release)
                    .bind(lease.name().as_str())
                    .bind(lease.owner().as_uuid())
                    .bind(fence)
                    .bind(&self.sql.channel)
                    .bind(&topic)
                    .bind(watch)
                    .fetch_one(c)
            })
            .await?;
        Ok(if released == 1 {
            tracing::debug!(rw_lock = %lease.name(), fence = %lease.fence(), "released");
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Removes, in the background, the share the attempt by `owner` may
    /// have got when its reply was lost, as `forget_later` does for locks.
    fn forget_share_later(self: &Arc<Self>, name: &LockName, owner: OwnerToken, until: Instant) {
        let name = name.clone();
        let what = "removing the share of a reader-writer acquire whose reply was lost";
        self.undo_later(until, what, move |client| {
            let name = name.clone();
            async move { client.forget_share(&name, owner).await }
        });
    }

    /// Removes the live share of `owner` (unique to one attempt) of `name`.
    async fn forget_share(&self, name: &LockName, owner: OwnerToken) -> Result<i64, LockError> {
        let (topic, watch) = self.rw_topic(name);
        let mut op = self.checkout("cleanup").await?;
        op.run(|c| {
            sqlx::query_scalar(&self.sql.rw.forget)
                .bind(name.as_str())
                .bind(owner.as_uuid())
                .bind(&self.sql.channel)
                .bind(&topic)
                .bind(watch)
                .fetch_one(c)
        })
        .await
    }

    /// Removes the intent `intent` of a writer that stopped waiting for
    /// `name`, waking the name's waiters if some wait: how many were removed.
    pub(crate) async fn leave(&self, name: &LockName, intent: Uuid) -> Result<i64, LockError> {
        let (topic, watch) = self.rw_topic(name);
        let mut op = self.checkout("leave reader-writer line").await?;
        let left = op
            .run(|c| {
                sqlx::query_scalar(&self.sql.rw.leave)
                    .bind(name.as_str())
                    .bind(intent)
                    .bind(&self.sql.channel)
                    .bind(&topic)
                    .bind(watch)
                    .fetch_one(c)
            })
            .await?;
        self.intents.lock().remove(&intent);
        Ok(left)
    }

    /// Removes every intent this client may still have in the store: at
    /// `close`, for writers whose wait the closing ended before they could
    /// hand theirs to the clean-ups. One that cannot be removed lapses.
    pub(crate) async fn leave_intents(&self) {
        let left: Vec<(Uuid, LockName)> = self.intents.lock().drain().collect();
        for (intent, name) in left {
            if let Err(error) = self.leave(&name, intent).await {
                tracing::debug!(rw_lock = %name, %error, "leaving a writer's intent at close failed; it lapses within the writer's TTL");
            }
        }
    }

    /// Every live holder of the reader-writer lock `name`, by fence.
    pub(crate) async fn inspect_shares(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let mut op = self.checkout("inspect reader-writer lock").await?;
        let rows: Vec<ShareRow> = op
            .run(|c| {
                sqlx::query_as(&self.sql.rw.inspect)
                    .bind(name.as_str())
                    .fetch_all(c)
            })
            .await?;
        rows.into_iter()
            .map(|(owner, access, fence, remaining, label)| {
                let access = Access::parse(&access).ok_or_else(|| {
                    error::corrupt(format!("the reader-writer table holds access {access:?}"))
                })?;
                Ok(Holder::new(
                    fence_token(fence)?,
                    Some(OwnerToken::from_uuid(owner)),
                    Some(from_micros(remaining)),
                )
                .with_access(access)
                .with_label(label.and_then(|l| HolderLabel::new(l).ok())))
            })
            .collect()
    }

    /// The wake-up topic of the reader-writer lock `name` (the payload its
    /// changes notify) and its watch key.
    fn rw_topic(&self, name: &LockName) -> (String, i64) {
        let topic = keys::rw_topic(name.as_str());
        let watch = keys::watch_key(&self.sql.table, &topic);
        (topic, watch)
    }
}
