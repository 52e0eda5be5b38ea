//! Setting a held lease's remaining time exactly, shorter or longer, on the
//! host's boot clock: one owner- and fence-checked `UPDATE`. The grant's
//! presence file is let go and its row unlinked from it, and this client
//! forgets the grant, so the lease then outlives this process and its
//! close: what a job's `at_least` needs, when the process that ran it exits
//! right after.

use lockcore::backend::{Ttl, timed};
use lockcore::{Lease, LockError};

use super::{clock, fence_of, sql};
use crate::connection::Client;
use crate::error::{self, BACKEND};
use crate::keys::{self, Kind};

impl Client {
    /// Sets `lease`'s expiry to now + `remaining` on the boot clock, if its
    /// owner still holds it.
    pub(crate) async fn set_remaining(
        &self,
        lease: &Lease,
        remaining: Ttl,
    ) -> Result<Lease, LockError> {
        self.open()?;
        let sent = lease.now();
        let fence = lease.fence().get();
        let set = timed(BACKEND, "set_remaining", self.limit, async {
            let mut tx = self.begin().await?;
            let now = self.clock.now()?;
            let until: Option<i64> = sqlx::query_scalar(sql::SET_REMAINING)
                .bind(now.saturating_add(clock::nanos(remaining.get())))
                .bind(Kind::of(lease).as_str())
                .bind(lease.name().as_str())
                .bind(keys::slot_of(lease))
                .bind(lease.owner().encode())
                .bind(fence_of(lease))
                .bind(self.clock.boot_id())
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .map_err(error::map)?;
            tx.commit().await.map_err(error::map)?;
            Ok(until)
        })
        .await?;
        let Some(until) = set else {
            self.forget(fence, Some(lease), false);
            return Err(LockError::NotHeld {
                name: lease.name().clone(),
            });
        };
        tracing::debug!(name = %lease.name(), fence, until, "remaining time set");
        // The lease is the store's alone from here: this client lets go of
        // it (closing the client does not release it). The row no longer
        // names the presence file: closing it frees nothing, removing it
        // wakes waiters, who find the row held until `until`.
        self.forget(fence, Some(lease), true);
        Ok(lease.clone().with_ttl(remaining).renewed(sent))
    }
}
