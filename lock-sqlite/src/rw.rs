//! Reader-writer locks: each holder is a row `(kind = 'rw', name, slot =
//! its fence)` of the lease table with its `access`, and each waiting
//! writer leaves an intent, a row `(kind = 'intent', name, slot = a fence
//! taken for it)`. Both are judged as every lease is (expiry on the boot
//! clock, a presence file whose `flock` proves their process alive), and
//! every holder is a lease of its own: renewed, released, set and closed as
//! locks are (`locks.rs`), its fence from the file's one counter.
//!
//! One `BEGIN IMMEDIATE` transaction per attempt: a read is granted while
//! no live writer holds the name and no live intent is there; a write while
//! no live holder is. A waiting writer's refused attempt makes its intent
//! (or moves its expiry, once a third of its TTL has passed) in the same
//! transaction; its grant deletes it in
//! the same transaction. How a writer waits, and its intent's life, is in
//! `intent.rs`.

pub(crate) mod intent;
mod sql;

use lockcore::backend::{LockRequest, timed};
use lockcore::{Access, Attempt, LockError};

use crate::connection::{Client, Tx};
use crate::error::{self, BACKEND};
use crate::keys::Kind;
use crate::locks::grant::NewRow;
use crate::locks::{clock, sql as lease_sql};
use intent::{Intent, REFRESH_AT_LEFT};

impl Client {
    /// One attempt at `access` of the reader-writer lock `request.name()`;
    /// leaves no intent.
    pub(crate) async fn try_grant_rw(
        &self,
        request: &LockRequest,
        access: Access,
    ) -> Result<Attempt, LockError> {
        self.open()?;
        timed(
            BACKEND,
            "acquire",
            self.limit,
            self.grant_rw(request, access, None),
        )
        .await
    }

    /// One attempt at `access` of `request.name()`. `waiting` is the place
    /// of a waiting writer's intent: refused, the attempt makes it there or
    /// moves its expiry; granted, its row goes in the grant's transaction.
    pub(crate) async fn grant_rw(
        &self,
        request: &LockRequest,
        access: Access,
        waiting: Option<&mut Option<Intent>>,
    ) -> Result<Attempt, LockError> {
        let sent = request.now();
        let name = request.name();
        let (mut tx, now) = self.begin_grant().await?;
        let (holders, stale) = self.judge(Self::rows(&mut tx, Kind::Rw, name).await?, now);
        let (intents, stale_intents) =
            self.judge(Self::rows(&mut tx, Kind::Intent, name).await?, now);
        // When the first of what keeps `access` out expires: for a read, a
        // writer that holds or waits; for a write, any holder.
        let blocked_until = match access {
            Access::Read => (holders.iter())
                .filter(|r| r.access != Some(Access::Read))
                .chain(&intents)
                .map(|r| r.expires_at)
                .min(),
            Access::Write => holders.iter().map(|r| r.expires_at).min(),
        };
        if let Some(until) = blocked_until {
            let mut expires_in = clock::duration(until - now);
            if let Some(intent) = waiting {
                let ttl = request.ttl().get();
                match intent.as_ref().and_then(|i| i.due_in(now, ttl)) {
                    // Not due: nothing written, `tx` goes uncommitted (a
                    // woken writer that is refused costs no durable write).
                    Some(due_in) => expires_in = expires_in.min(due_in),
                    None => {
                        self.keep_intent(tx, request, intent, now).await?;
                        expires_in = expires_in.min(ttl.mul_f64(1.0 - REFRESH_AT_LEFT));
                    }
                }
            }
            return Ok(Attempt::Held {
                expires_in: Some(expires_in),
            });
        }
        self.drop_rows(&mut tx, Kind::Rw, name, &stale).await?;
        self.drop_rows(&mut tx, Kind::Intent, name, &stale_intents)
            .await?;
        if let Some(Some(intent)) = waiting.as_deref() {
            self.delete_intent(&mut tx, request, intent).await?;
        }
        let row = NewRow {
            kind: Kind::Rw,
            request,
            slot: None,
            permits: 1,
        };
        let lease = self.hand_out(tx, row, now, sent).await?;
        if let Some(intent) = waiting.and_then(Option::take) {
            intent.granted(self);
        }
        self.tidy_stale(&stale);
        self.tidy_stale(&stale_intents);
        Ok(Attempt::Acquired(lease))
    }

    /// Makes the intent of the writer of `request` in `intent`, or moves
    /// its expiry a TTL from `now` if it is there; commits `tx`.
    async fn keep_intent(
        &self,
        mut tx: Tx,
        request: &LockRequest,
        intent: &mut Option<Intent>,
        now: i64,
    ) -> Result<(), LockError> {
        if let Some(kept) = intent {
            let until = now.saturating_add(clock::nanos(request.ttl().get()));
            let moved: Option<i64> = sqlx::query_scalar(sql::REFRESH_INTENT)
                .bind(until)
                .bind(request.name().as_str())
                .bind(kept.fence())
                .bind(kept.owner().encode())
                .bind(self.clock.boot_id())
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .map_err(error::map)?;
            if moved.is_some() {
                tx.commit().await.map_err(error::map)?;
                kept.moved(until);
                return Ok(());
            }
            // Lapsed (this writer stood still past its TTL) and maybe taken
            // away: a new one, and the old one's row and file removed.
        }
        let row = NewRow {
            kind: Kind::Intent,
            request,
            slot: None,
            permits: 1,
        };
        let written = self.write_row(tx, row, now).await?;
        *intent = Some(Intent::new(self, request, written)?);
        Ok(())
    }

    /// Deletes `intent`'s row in `tx` (owner- and fence-checked).
    async fn delete_intent(
        &self,
        tx: &mut Tx,
        request: &LockRequest,
        intent: &Intent,
    ) -> Result<(), LockError> {
        sqlx::query(lease_sql::RELEASE)
            .bind(Kind::Intent.as_str())
            .bind(request.name().as_str())
            .bind(intent.fence())
            .bind(intent.owner().encode())
            .bind(intent.fence())
            .fetch_optional(&mut **tx)
            .await
            .map_err(error::map)?;
        Ok(())
    }
}
