//! Waiting for a reader-writer lock: lockcore's one wait loop, with a
//! [`Waiter`] whose first attempt either grants at once or, in the same
//! `Txn`, puts our entry in line (a writer's entry is its intent: readers
//! that come after it wait behind it). Later attempts are one grant `Txn`
//! each from that entry, woken by the deletes that may admit us: a
//! writer's (held or in line) for a reader, any for a writer.
//!
//! The session keeps the entry alive while we wait (the keeper refreshes
//! it, and moves it off a session retired after a lost reply); etcd drops
//! it with the session one TTL after a crash. A waiter that gives up
//! (timeout, error, dropped) deletes it in the background, as a lock's
//! waiter does (`Inner::leave_line`, a clean-up closing finishes); one
//! dropped with a `Txn` in flight undoes what it may have written.

use std::sync::{Arc, Mutex};

use lockcore::backend::wait::{WaitPolicy, Waiter, Wakeup};
use lockcore::backend::{LockRequest, async_trait};
use lockcore::{Access, Attempt, Lease, LockError};

use super::{Admission, Ahead, TRIES};
use crate::connection::client::Inner;
use crate::connection::session::Attached;
use crate::error::BACKEND;
use crate::keys::rw::RwKeys;
use crate::locks::grant::Sending;
use crate::wait::hub::Events;

/// `LockBackend::acquire` of a reader-writer lock: wait in line until
/// granted or the deadline.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    request: &LockRequest,
    wait: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let Some(access) = request.access() else {
        return Err(request.kind().unsupported(BACKEND));
    };
    let mut waiter = ShareWaiter {
        keys: inner.keys.rw(request.name()),
        inner: inner.clone(),
        request: request.clone(),
        access,
        place: None,
        sending: Sending::default(),
        ahead: Arc::default(),
    };
    lockcore::backend::wait::wait(wait, &mut waiter).await
}

struct ShareWaiter {
    inner: Arc<Inner>,
    request: LockRequest,
    access: Access,
    keys: RwKeys,
    /// Our entry in line.
    place: Option<Attached>,
    /// What the `Txn` in flight may write.
    sending: Sending,
    /// What refused our last `Txn`, while we wait in line.
    ahead: Arc<Mutex<Option<Ahead>>>,
}

#[async_trait]
impl Waiter for ShareWaiter {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        let mut deletes = self
            .inner
            .hub
            .subscribe(self.keys.base(), Events::Deletes)
            .await?;
        let wakes: Vec<Vec<u8>> = match self.access {
            Access::Read => vec![
                self.keys.held_by(Access::Write),
                self.keys.waiting_for(Access::Write),
            ],
            Access::Write => vec![self.keys.base().to_vec()],
        };
        let own = self.place.as_ref().map(|p| p.key.clone());
        // Filled in by the attempt this wake-up follows (it runs first).
        let ahead = self.ahead.clone();
        *ahead.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(Some(Box::pin(async move {
            // Also wakes when the watch is gone: the caller looks again.
            while let Some(deleted) = deletes.next().await {
                if own.as_ref() == Some(&deleted.key) {
                    return;
                }
                let mut ahead = ahead.lock().unwrap_or_else(|p| p.into_inner());
                match ahead.as_mut() {
                    Some(ahead) => {
                        if deleted.revision > ahead.at {
                            ahead.keys.remove(&deleted.key);
                        }
                        if ahead.keys.is_empty() {
                            return;
                        }
                    }
                    // Not refused from a place in line: any delete that may
                    // admit us.
                    None if wakes.iter().any(|w| deleted.key.starts_with(w)) => return,
                    None => {}
                }
            }
        })))
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        for _ in 0..TRIES {
            let queue = self.place.is_none();
            let admission = self
                .inner
                .admit(
                    &self.request,
                    self.access,
                    self.place.as_ref(),
                    queue,
                    &mut self.sending,
                )
                .await?;
            let refusal = match admission {
                Admission::Granted(lease) => {
                    self.place = None; // deleted by the grant
                    return Ok(Attempt::Acquired(lease));
                }
                Admission::Refused(refusal) => refusal,
            };
            if refusal.gone
                && let Some(place) = self.place.take()
            {
                // Queue again (at once: a new entry, on a live session).
                self.inner.sessions.forget(&place.key, place.revision);
            }
            if let Some(queued) = refusal.queued {
                self.place = Some(queued);
            }
            if self.place.is_some() && !refusal.again && !refusal.gone {
                if !refusal.ahead.keys.is_empty() {
                    *self.ahead.lock().unwrap_or_else(|p| p.into_inner()) = Some(refusal.ahead);
                }
                return Ok(Attempt::Held { expires_in: None });
            }
        }
        match self.place {
            Some(_) => Ok(Attempt::Held { expires_in: None }),
            None => Err(LockError::unavailable(
                BACKEND,
                "could not queue for the reader-writer lock; trying again",
            )),
        }
    }
}

impl Drop for ShareWaiter {
    fn drop(&mut self) {
        std::mem::take(&mut self.sending).undo(&self.inner);
        if let Some(place) = self.place.take() {
            self.inner.leave_line(place);
        }
    }
}
