//! Waiting for a reader-writer lock: lockcore's one wait loop, driving a
//! waiter that arms the lock's wake-up (LISTEN/NOTIFY, see `wait/notify.rs`)
//! and makes one grant attempt per round.
//!
//! A waiting writer goes first: each of its attempts that is refused
//! leaves its intent in the store (or refreshes it) in the same
//! transaction, expiring after the writer's TTL on the server's clock, and
//! no reader is granted while a live intent is there. Its attempts come
//! at least every third of its TTL, to keep the intent alive. The attempt
//! that grants the write removes the intent with it. A writer that stops
//! waiting without a grant removes it: at once when the wait ends (timeout
//! or error); in the background (one of the client's clean-ups, which
//! `close` finishes) when its future is dropped or the removal failed; by
//! `close` itself for a wait the closing ended (the client keeps the ids
//! of intents that may be in the store). A writer whose process died
//! leaves it to lapse within its TTL.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::wait::{self, WaitPolicy, Waiter, Wakeup};
use lockcore::backend::{LockRequest, async_trait};
use lockcore::{Access, Attempt, Lease, LockError, LockName};
use tokio::time::Instant;
use uuid::Uuid;

use crate::connection::Client;
use crate::keys;

/// Waits for `access` of the reader-writer lock `request.name()` until
/// `policy.deadline` (`Ok(None)`); a writer leaves its intent meanwhile.
pub(crate) async fn wait(
    client: &Arc<Client>,
    request: &LockRequest,
    access: Access,
    policy: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let mut waiter = ShareWaiter {
        client,
        request,
        access,
        intent: (access == Access::Write).then(|| Intent::new(client, request.name())),
    };
    let got = wait::wait(policy, &mut waiter).await;
    if let Some(intent) = waiter.intent.take() {
        intent.leave().await;
    }
    got
}

/// One waiting `acquire` of a reader-writer lock.
struct ShareWaiter<'a> {
    client: &'a Arc<Client>,
    request: &'a LockRequest,
    access: Access,
    /// A writer's intent (`None` for a reader).
    intent: Option<Intent>,
}

#[async_trait]
impl Waiter for ShareWaiter<'_> {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        let topic = keys::rw_topic(self.request.name().as_str());
        Ok(self.client.wakeups.watch(topic).await)
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        let ttl = self.request.ttl().get();
        // From the moment it is sent, the attempt may leave the intent.
        let intent = self.intent.as_mut().map(|intent| {
            intent.lapses_by = Some(Instant::now() + ttl);
            intent.id
        });
        let attempt = self
            .client
            .try_share(self.request, self.access, intent)
            .await?;
        Ok(match (attempt, &mut self.intent) {
            (Attempt::Acquired(lease), intent) => {
                // The grant removed the intent.
                if let Some(intent) = intent {
                    intent.lapses_by = None;
                }
                Attempt::Acquired(lease)
            }
            // Back in time to refresh the intent.
            (Attempt::Held { expires_in }, Some(_)) => {
                let refresh = refresh_within(ttl);
                Attempt::Held {
                    expires_in: Some(expires_in.map_or(refresh, |left| left.min(refresh))),
                }
            }
            (held, None) => held,
        })
    }
}

/// A waiting writer's intent: while it lives in the store, no reader is
/// granted the name. Dropped while it may be there, it is removed in the
/// background.
struct Intent {
    client: Arc<Client>,
    name: LockName,
    id: Uuid,
    /// When the intent lapses at the latest, while it may be in the store.
    lapses_by: Option<Instant>,
}

impl Intent {
    fn new(client: &Arc<Client>, name: &LockName) -> Self {
        Intent {
            client: client.clone(),
            name: name.clone(),
            id: Uuid::new_v4(),
            lapses_by: None,
        }
    }

    /// Removes the intent now (one statement), if it may be in the store;
    /// if that fails, `Drop` retries in the background.
    async fn leave(mut self) {
        if self.lapses_by.is_none() {
            return;
        }
        match self.client.leave(&self.name, self.id).await {
            Ok(_) => self.lapses_by = None,
            Err(error) => {
                tracing::debug!(rw_lock = %self.name, %error, "leaving the writer's intent failed; retrying in the background");
            }
        }
    }
}

impl Drop for Intent {
    fn drop(&mut self) {
        let Some(until) = self.lapses_by.take() else {
            return;
        };
        let (name, id) = (self.name.clone(), self.id);
        let what = "removing the intent of a writer that stopped waiting";
        self.client.undo_later(until, what, move |client| {
            let name = name.clone();
            async move { client.leave(&name, id).await }
        });
    }
}

/// The longest a waiting writer goes between attempts, each of which
/// refreshes its intent: a third of its TTL, so a late attempt or two
/// still find it alive.
fn refresh_within(ttl: Duration) -> Duration {
    ttl / 3
}
