//! Waiters and wake-ups: a waiter watches the presence files of a name's
//! live holders (inotify, `inotify.rs`) and wakes at the first change of
//! any (released, evicted, its process dead); a free name, which has none,
//! wakes it only if something was granted in the file since it looked (the
//! fence counter moved). A holder's own watch of its presence file is its
//! eviction notice, checked against its row here.

#[cfg_attr(not(target_os = "linux"), path = "wait/inotify_none.rs")]
pub(crate) mod inotify;

use std::sync::Weak;

use lockcore::backend::CancellationToken;
use lockcore::backend::wait::Wakeup;
use lockcore::{LockError, LockName};
use sqlx::Row as _;
use tokio::sync::mpsc;

use crate::connection::Client;
use crate::error::{self, BACKEND};
use crate::fence::LAST_FENCE;
use crate::keys::Kind;
use crate::locks::{Row, sql};

impl Client {
    /// A wake-up for the next change of `kind` `name`: the first change of
    /// any live holder's presence file (or, for a reader-writer lock, any
    /// waiting writer's); if a slot is free now (nobody holds or waits to
    /// write a reader-writer lock: its rows are of one seat), see
    /// [`granted_since`](Self::granted_since); `None` if one of them cannot
    /// be watched (its waiters then poll).
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
        // Read before the rows: a grant they miss moves it later.
        let last = Self::last_fence(&mut conn).await?;
        let mut rows = Self::rows(&mut conn, kind, name).await?;
        if kind == Kind::Rw {
            // A waiting writer keeps readers out too: its end may let them in.
            rows.extend(Self::rows(&mut conn, Kind::Intent, name).await?);
        }
        drop(conn);
        let now = self.clock.now()?;
        let live: Vec<&Row> = rows.iter().filter(|r| self.is_live(r, now)).collect();
        let seats = live.first().map_or(1, |r| r.permits);
        if (live.len() as i64) < seats {
            return Ok(Some(self.granted_since(last)));
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
        Ok(Some(inotify::first_of(wakeups)))
    }

    /// The wake-up of a name with a free slot, which has no presence file
    /// to watch. Polled once the attempt that follows it ran, it fires if
    /// anything was granted in the file since its fence counter was `last`
    /// (every grant takes a fence): the slot may have been taken meanwhile,
    /// and the next round watches its holder. Otherwise it never fires: the
    /// name is not what keeps the waiter out (a multi-lock waits on its
    /// held names, and must not retry at once, over and over, on its free
    /// ones). An attempt that was granted never polls it: no read.
    fn granted_since(&self, last: i64) -> Wakeup {
        let client = self.me.clone();
        Box::pin(async move {
            let unmoved = match client.upgrade() {
                Some(client) => match client.read().await {
                    Ok(mut conn) => Self::last_fence(&mut conn)
                        .await
                        .is_ok_and(|now| now == last),
                    Err(_) => false,
                },
                None => false,
            };
            if unmoved {
                std::future::pending::<()>().await;
            }
        })
    }

    /// The file's fence counter.
    async fn last_fence(conn: &mut sqlx::SqliteConnection) -> Result<i64, LockError> {
        (sqlx::query_scalar(LAST_FENCE).fetch_one(conn).await).map_err(error::map)
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

/// Checks every touched presence file of ours, until the client is closed
/// or dropped.
pub(crate) async fn check_touched(
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
