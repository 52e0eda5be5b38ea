//! Setting a held lease's remaining time, shorter or longer, on etcd's
//! lease timer: a grant leaves its session for a lease of its own, granted
//! for the time asked (rounded up to etcd's whole seconds, and at least its
//! minimum TTL: only ever longer), and its key is re-put onto that lease by
//! one `Txn` that compares it is still this grant, as a release does. The
//! key keeps its create revision, value and so its fence; waiters see its
//! delete when etcd expires the lease. This client forgets the grant, so no
//! renewal keeps it and closing the client (revoking its sessions) leaves
//! it alone: what a job's `at_least` needs, when the process that ran it
//! exits right after.

use etcd_client::{PutOptions, Txn, TxnOp};
use lockcore::backend::Ttl;
use lockcore::{Lease, LockError};

use crate::connection::client::Inner;
use crate::connection::session::Leaving;
use crate::keys::unchanged;
use crate::locks::grant::Grant;

impl Inner {
    /// Moves `lease`'s key onto a lease of `remaining` of its own, if its
    /// owner still holds it.
    pub(crate) async fn set_remaining(
        &self,
        lease: &Lease,
        remaining: Ttl,
    ) -> Result<Lease, LockError> {
        let not_held = || LockError::NotHeld {
            name: lease.name().clone(),
        };
        let Some(grant) = Grant::of(lease) else {
            return Err(not_held());
        };
        // etcd counts a lease from its grant, which leaves after this.
        let sent = lease.now();
        let booked = match self.sessions.leave(&grant.key, grant.revision) {
            Leaving::Over => return Err(not_held()),
            Leaving::Marked => true,
            Leaving::Unbooked => false,
        };
        match self.onto_own_lease(grant, remaining).await {
            Ok(true) => {
                self.sessions.left(&grant.key, grant.revision);
                tracing::debug!(name = %lease.name(), fence = %lease.fence(), ?remaining, "remaining time set");
                Ok(lease.clone().with_ttl(remaining).renewed(sent))
            }
            Ok(false) => {
                if let Some(entry) = self.sessions.left(&grant.key, grant.revision) {
                    entry.lost.cancel();
                }
                Err(not_held())
            }
            Err(e) => {
                if booked {
                    // Maybe still on its session: it expires on its TTL.
                    self.sessions.stay(&grant.key, grant.revision);
                }
                Err(e)
            }
        }
    }

    /// Grants a lease of `remaining` (whole seconds, rounded up) and puts
    /// `grant`'s key on it if it is still that grant: `Ok(false)` if it is
    /// not. A lease that did not get the key is revoked, best effort; after
    /// an error, the key may be on it all the same (a reply lost): it goes
    /// with it, no later than its TTL on its session would have ended it.
    async fn onto_own_lease(&self, grant: &Grant, remaining: Ttl) -> Result<bool, LockError> {
        let secs = i64::try_from(remaining.as_secs_ceil()).unwrap_or(i64::MAX);
        let (own, _) = self.sessions.grant(secs).await?;
        let txn = Txn::new()
            .when(unchanged(&grant.key, grant.revision, &grant.value))
            .and_then([TxnOp::put(
                grant.key.clone(),
                Vec::new(), // kept as it is: `ignore_value` takes none
                Some(PutOptions::new().with_lease(own).with_ignore_value()),
            )]);
        let moved = self
            .txn("set_remaining", txn)
            .await
            .map(|reply| reply.succeeded());
        if !matches!(moved, Ok(true)) {
            self.sessions.spawn_revoke(own);
        }
        moved
    }
}
