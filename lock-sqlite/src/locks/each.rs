//! Multi-locks: every lock of a batch granted in one `BEGIN IMMEDIATE`
//! transaction, or none. Each name is judged and granted exactly as a lock
//! alone is (`grant.rs`): every name's rows judged first, nothing written
//! until all are free; then the stale rows of each dropped and a row
//! written for each, with its own fence from the file's counter and its
//! own presence file, all committed at once. A commit cut short is undone
//! row by row, each row by its own undo. The file keeps no waiting line (a
//! waiter of this process waits its turn in memory, `wait.rs`; the file
//! records nothing of it), so a name free to one lock is free to a batch.

use lockcore::backend::{LockRequest, Moment, check_each, timed};
use lockcore::{AttemptEach, LockError};

use super::grant::{NewRow, Seat};
use crate::connection::Client;
use crate::error::BACKEND;
use crate::keys::Kind;

impl Client {
    /// One attempt at every lock of `requests`: every one, their leases in
    /// order, or none and a name found held.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no request, one that is not a lock,
    /// or a name asked twice, before any I/O; a store error.
    pub(crate) async fn try_grant_each(
        &self,
        requests: &[LockRequest],
    ) -> Result<AttemptEach, LockError> {
        check_each(requests)?;
        self.open()?;
        timed(BACKEND, "acquire", self.limit, self.grant_each(requests)).await
    }

    async fn grant_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        let sent: Vec<Moment> = requests.iter().map(LockRequest::now).collect();
        let (mut tx, now) = self.begin_grant().await?;
        let mut rows = Vec::with_capacity(requests.len());
        let mut stale = Vec::with_capacity(requests.len());
        for request in requests {
            let name = request.name();
            match self.seat(&mut tx, Kind::Lock, name, 1, now).await? {
                Seat::Free { slot, stale: gone } => {
                    rows.push(NewRow {
                        kind: Kind::Lock,
                        request,
                        slot: Some(slot),
                        permits: 1,
                    });
                    stale.push(gone);
                }
                // `tx` goes uncommitted: nothing was written.
                Seat::Taken { expires_in } => {
                    return Ok(AttemptEach::Held {
                        name: name.clone(),
                        expires_in: Some(expires_in),
                    });
                }
            }
        }
        for (row, gone) in rows.iter().zip(&stale) {
            self.drop_rows(&mut tx, Kind::Lock, row.request.name(), gone)
                .await?;
        }
        let leases = self.hand_out_each(tx, &rows, now, &sent).await?;
        for gone in &stale {
            self.tidy_stale(gone);
        }
        Ok(AttemptEach::Acquired(leases))
    }
}
