//! A waiting writer: the adapter's [`Waiter`] for
//! `lockcore::backend::wait::wait` when a write waits. Each attempt carries
//! the wait's intent id: refused, the script (re)writes the intent with an
//! expiry one TTL ahead, and no reader is granted while it is there;
//! granted, the same script removes it. The loop comes back within a third
//! of the TTL, so a live wait's intent never lapses, and a dead process's
//! lapses within its TTL.

use std::sync::Arc;

use lockcore::backend::LockRequest;
use lockcore::backend::wait::{Waiter, Wakeup};
use lockcore::{Access, Attempt, LockError, OwnerToken};
use tokio::time::Instant;

use crate::connection::client::Client;
use crate::keys::RwKeys;

/// A writer's wait. Dropped before a grant (timeout, error, cancellation),
/// it removes its intent in the background and wakes the readers it kept
/// out.
pub(crate) struct WriterWaiter<'a> {
    client: Arc<Client>,
    request: &'a LockRequest,
    keys: RwKeys,
    intent: String,
    /// An attempt carrying the intent was sent: the store may hold it.
    sent: bool,
    granted: bool,
}

impl<'a> WriterWaiter<'a> {
    pub(crate) fn new(client: Arc<Client>, request: &'a LockRequest) -> Self {
        WriterWaiter {
            keys: client.rw_keys(request.name()),
            client,
            request,
            intent: OwnerToken::new().encode(),
            sent: false,
            granted: false,
        }
    }
}

#[async_trait::async_trait]
impl Waiter for WriterWaiter<'_> {
    /// A wake-up at the next release, or when a share or intent expires.
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        Ok(Some(self.client.watch_shares(&self.keys).await?))
    }

    /// One acquire script with the intent; a refusal asks the loop back
    /// within a third of the TTL, to refresh the intent in time.
    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        self.sent = true;
        let outcome = self
            .client
            .acquire_share(self.request, Access::Write, Some(&self.intent))
            .await;
        self.granted = matches!(outcome, Ok(Attempt::Acquired(_)));
        let refresh = self.request.ttl().get() / 3;
        outcome.map(|attempt| match attempt {
            Attempt::Held { expires_in } => Attempt::Held {
                expires_in: Some(expires_in.map_or(refresh, |left| left.min(refresh))),
            },
            granted => granted,
        })
    }
}

impl Drop for WriterWaiter<'_> {
    fn drop(&mut self) {
        if self.granted || !self.sent {
            return;
        }
        self.client.leave_share_later(
            self.keys.clone(),
            std::mem::take(&mut self.intent),
            String::new(),
            Instant::now() + self.request.ttl().get(),
        );
    }
}
