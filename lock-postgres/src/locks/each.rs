//! Multi-locks: every lock of a batch granted in one short transaction, or
//! none. Each name's row is granted by the acquire statement itself, with
//! its own owner token, fence from the sequence, TTL and label, exactly as
//! a `try_acquire` of it would be (taking a free lock whoever waits in its
//! turnstile line, as `try_acquire` does: the line only orders waiters); the
//! first name found held rolls the whole transaction back.
//!
//! Row locks are taken in name order (the order of the table's `COLLATE
//! "C"` key and of Rust's `str`), whatever order the requests come in, so
//! two batches never wait for each other in a cycle; a single acquire locks
//! one row, and `purge_free` skips locked rows. A look at the names first,
//! outside any transaction, answers a batch with a live holder without
//! writing anything (no row lock, no transaction id): what a waiting
//! multi-lock does at each retry while a name is held.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{LockRequest, Moment, check_each};
use lockcore::{AttemptEach, LockError, OwnerToken};
use sqlx::Connection;

use super::{Take, granted, sql, verdict};
use crate::connection::{Client, from_micros, ttl_micros};
use crate::error;
use crate::wait::notify::Pending;

/// How a batch's transaction ended: each request's fence, in request
/// order, or the position of the request found held and its holder's
/// remaining time.
type Outcome = Result<Vec<i64>, (usize, Option<Duration>)>;

impl Client {
    /// One attempt at every lock of `requests`: their leases in request
    /// order, or none taken and a name found held.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for no request, one that is not a lock,
    /// or a name asked twice, before any I/O; an invalid TTL; a store error
    /// (after which what the reply may have granted is freed in the
    /// background, lease by lease).
    pub(crate) async fn try_acquire_each(
        self: &Arc<Self>,
        requests: &[LockRequest],
    ) -> Result<AttemptEach, LockError> {
        let order = lock_order(requests)?;
        let ttls = (requests.iter())
            .map(|r| ttl_micros(r.ttl()))
            .collect::<Result<Vec<_>, _>>()?;
        let owners: Vec<OwnerToken> = requests.iter().map(|_| OwnerToken::new()).collect();
        // Counted from before the wait for a connection, on each request's
        // clock: the local deadlines may only be early.
        let sent: Vec<Moment> = requests.iter().map(LockRequest::now).collect();
        let mut op = self.checkout("acquire").await?;
        if let Some(wait) = self.era.grants_wait() {
            return Ok(AttemptEach::Held {
                name: requests[order[0]].name().clone(),
                expires_in: Some(wait),
            });
        }
        let names: Vec<&str> = requests.iter().map(|r| r.name().as_str()).collect();
        let held: Option<(String, i64)> = op
            .run(|c| {
                sqlx::query_as(&self.sql.held)
                    .bind(&names)
                    .fetch_optional(c)
            })
            .await?;
        if let Some((name, left)) = held {
            let Some(request) = requests.iter().find(|r| r.name().as_str() == name) else {
                return Err(error::corrupt(format!(
                    "asked about {names:?}, got {name:?}"
                )));
            };
            return Ok(AttemptEach::Held {
                name: request.name().clone(),
                expires_in: Some(from_micros(left)),
            });
        }
        // Registered before the grants are sent, as a single acquire's.
        let pending: Vec<Pending> = (requests.iter().zip(&owners))
            .map(|(r, owner)| self.wakeups.expect(r.name().as_str(), owner.as_uuid()))
            .collect();
        let (order, owners_in, ttls_in) = (&order, &owners, &ttls);
        let outcome: Result<Outcome, LockError> = op
            .run(|c| async move {
                let mut tx = c.begin_with(sql::BEGIN).await?;
                let mut fences = vec![0; requests.len()];
                for &i in order {
                    let rows = self
                        .grant(&requests[i], owners_in[i], ttls_in[i], Take::Any)
                        .fetch_all(&mut *tx)
                        .await?;
                    match verdict(&rows) {
                        Ok(fence) => fences[i] = fence,
                        Err(left) => {
                            tx.rollback().await?;
                            return Ok(Err((i, left)));
                        }
                    }
                }
                tx.commit().await?;
                Ok(Ok(fences))
            })
            .await;
        let fences = match outcome {
            Ok(Ok(fences)) => fences,
            Ok(Err((i, expires_in))) => {
                return Ok(AttemptEach::Held {
                    name: requests[i].name().clone(),
                    expires_in,
                });
            }
            Err(e) => {
                // The commit may have happened without its answer: each
                // lease held for nobody is freed by its own owner token.
                if op.in_doubt() {
                    for ((request, owner), sent) in requests.iter().zip(&owners).zip(&sent) {
                        let until = sent.mono() + request.ttl().get();
                        self.forget_later(request.name(), *owner, until);
                    }
                }
                return Err(e);
            }
        };
        let leases = (requests.iter().zip(pending).enumerate())
            .map(|(i, (request, pending))| granted(request, owners[i], fences[i], sent[i], pending))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AttemptEach::Acquired(leases))
    }
}

/// The positions of `requests` in name order (the order their rows are
/// locked in), after checking the batch: locks only, at least one, each
/// name once.
fn lock_order(requests: &[LockRequest]) -> Result<Vec<usize>, LockError> {
    check_each(requests)?;
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| requests[a].name().cmp(requests[b].name()));
    Ok(order)
}
