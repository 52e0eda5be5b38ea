//! Waiting in line: the adapter's [`Waiter`] for `lockcore::backend::wait::wait`.
//!
//! The first attempt joins the name's line in Redis (`wait/scripts/line.lua`); a
//! release (or anyone finding the lock free) wakes the first waiter only,
//! holding the free lock for it while it claims. Without a subscription
//! connection a round polls instead (no place in line, and no barging: a
//! free lock goes to whoever heads the line).

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LockRequest;
use lockcore::backend::wait::{Waiter, Wakeup};
use lockcore::{Attempt, LockError, OwnerToken};
use tokio::time::Instant;

use super::LEAVE;
use super::notify::Wait;
use crate::connection::client::Client;
use crate::connection::script::prepare;
use crate::keys::Keys;

/// A waiting acquire's place in line. Dropped before a grant (timeout,
/// error, cancellation), it leaves the line in the background and frees
/// what an attempt still in flight may have got.
pub(crate) struct LineWaiter<'a> {
    client: Arc<Client>,
    request: &'a LockRequest,
    keys: Keys,
    /// How long the line is kept without a refresh: a waiter re-attempts at
    /// least every re-check, its entry outlives that.
    linger: Duration,
    wait: Option<Wait>,
    member: String,
    /// An attempt carrying `member` was sent: the line may hold it.
    joined: bool,
    /// The owner token of an attempt sent and not yet answered.
    in_flight: Option<OwnerToken>,
    granted: bool,
}

impl<'a> LineWaiter<'a> {
    pub(crate) fn new(client: Arc<Client>, request: &'a LockRequest, recheck: Duration) -> Self {
        LineWaiter {
            keys: client.keys(request.name()),
            linger: recheck.min(crate::MAX_TTL) + client.op_timeout,
            client,
            request,
            wait: None,
            member: String::new(),
            joined: false,
            in_flight: None,
            granted: false,
        }
    }
}

#[async_trait::async_trait]
impl Waiter for LineWaiter<'_> {
    /// Joins this instance's wake-ups (once); the wake-up of the coming
    /// round is this wait's turn in line.
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        if self.wait.is_none() {
            let wait = self.client.notifier.join().await?;
            let window = self.request.ttl().get().min(self.client.claim_window);
            self.member = wait.member(window);
            self.wait = Some(wait);
        }
        Ok(self.wait.as_ref().map(Wait::wakeup))
    }

    /// One acquire script, carrying this wait's member once it has one.
    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        let owner = OwnerToken::new();
        self.in_flight = Some(owner);
        let line = self
            .wait
            .is_some()
            .then_some((self.member.as_str(), self.linger));
        self.joined |= line.is_some();
        let outcome = self
            .client
            .acquire(self.request, &self.keys, owner, line)
            .await;
        self.in_flight = None;
        self.granted = matches!(outcome, Ok(Attempt::Acquired(_)));
        outcome
    }
}

impl Drop for LineWaiter<'_> {
    fn drop(&mut self) {
        if self.granted || (!self.joined && self.in_flight.is_none()) {
            return;
        }
        let member = if self.joined {
            std::mem::take(&mut self.member)
        } else {
            String::new()
        };
        self.client.leave_later(
            self.keys.clone(),
            member,
            self.in_flight,
            Instant::now() + self.request.ttl().get(),
        );
    }
}

impl Client {
    /// Takes `member` (if not empty) out of the line of `keys`, passing on a
    /// hand-off reserved for it, and frees the lock if `owner`'s attempt got
    /// it. Returns whether it freed the lock.
    pub(crate) async fn leave(
        &self,
        keys: &Keys,
        member: &str,
        owner: Option<OwnerToken>,
    ) -> Result<bool, LockError> {
        let mut call = prepare(&LEAVE);
        call.0.key(&keys.lock).key(&keys.queue).key(&keys.next);
        call.0
            .key(&keys.watchers)
            .arg(member)
            .arg(owner.map(|o| o.encode()).unwrap_or_default());
        let (freed,): (i64,) = self.invoke("leave", &call).await?;
        Ok(freed == 1)
    }
}
