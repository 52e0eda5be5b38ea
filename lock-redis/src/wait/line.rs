//! Waiting in line: the adapter's [`Waiter`] for `lockcore::backend::wait::wait`.
//!
//! The first attempt joins the name's line in Redis (`wait/scripts/line.lua`).
//! Every attempt of the wait carries the same owner token and records a
//! standing offer (`wait/scripts/handoff.lua`): a release (or anyone
//! finding the lock free) grants the lock to the first waiter on that offer
//! in the same script and tells it, and the wait returns the lease without
//! another request. Where no fresh offer stands, the release holds the free
//! lock for the waiter while it claims it. Without a subscription
//! connection a round polls instead (no place in line, and no barging: a
//! free lock goes to whoever heads the line).

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::wait::{Waiter, Wakeup};
use lockcore::backend::{LockRequest, Moment};
use lockcore::{Attempt, FencingToken, Lease, LockError, OwnerToken};
use tokio::time::Instant;

use super::LEAVE;
use super::handoff::InLine;
use super::notify::{HoldWatch, Wait};
use crate::connection::client::Client;
use crate::connection::script::prepare;
use crate::keys::Keys;

/// A waiting acquire's place in line. Dropped before a grant (timeout,
/// error, cancellation), it leaves the line in the background and frees
/// what an attempt in flight or a hand-off may have got.
pub(crate) struct LineWaiter<'a> {
    client: Arc<Client>,
    request: &'a LockRequest,
    keys: Keys,
    /// How long the line is kept without a refresh: a waiter re-attempts at
    /// least every re-check, its entry outlives that.
    linger: Duration,
    wait: Option<Wait>,
    member: String,
    /// The owner token of every attempt of this wait, and of a hand-off.
    owner: OwnerToken,
    /// Listens for an eviction of this wait's grant, from before the first
    /// attempt (a hand-off grant exists before the wait hears of it).
    watch: Option<HoldWatch>,
    /// The number of the last attempt sent.
    seq: u64,
    /// The send moments of the last two attempts, by number: a hand-off
    /// names the attempt whose offer it took, and its lease counts from
    /// that send.
    sent: [Option<(u64, Moment)>; 2],
    /// An attempt carrying `member` was sent: the line may hold it.
    joined: bool,
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
            owner: OwnerToken::new(),
            watch: None,
            seq: 0,
            sent: [None; 2],
            joined: false,
            granted: false,
        }
    }

    /// The lease a hand-off brought, if one came: counted from the send of
    /// the attempt whose offer the store took. A grant naming an attempt
    /// not among the last two is left to the next attempt, which finds the
    /// lock its owner's.
    fn handed_over(&mut self) -> Option<Lease> {
        let grant = self.wait.as_ref()?.take_grant()?;
        let sent_at = self
            .sent
            .iter()
            .flatten()
            .find(|(seq, _)| *seq == grant.seq)
            .map(|&(_, moment)| moment);
        let (Some(sent_at), Some(fence)) = (sent_at, FencingToken::new(grant.fence)) else {
            tracing::debug!(
                ?grant,
                "a hand-off for an attempt no longer known; claiming it"
            );
            return None;
        };
        let watch = self.watch.take()?;
        tracing::debug!(key = %self.keys.lock, %fence, "handed over");
        let lease = Lease::granted(self.request, self.owner, fence, sent_at);
        Some(self.client.with_watch(lease, watch))
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

    /// The lease a hand-off brought, else one acquire script, carrying
    /// this wait's member once it has one. While in line, the next attempt
    /// comes within a third of the TTL, so the standing offer stays fresh.
    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        if let Some(lease) = self.handed_over() {
            self.granted = true;
            return Ok(Attempt::Acquired(lease));
        }
        self.seq += 1;
        let member = if self.wait.is_some() {
            self.member.as_str()
        } else {
            ""
        };
        self.joined |= !member.is_empty();
        let line = InLine {
            member,
            linger: self.linger,
            seq: self.seq,
        };
        self.sent = [self.sent[1], Some((self.seq, self.request.now()))];
        let outcome = self
            .client
            .acquire(
                self.request,
                &self.keys,
                self.owner,
                Some(line),
                &mut self.watch,
            )
            .await;
        match outcome {
            Ok(Attempt::Acquired(lease)) => {
                self.granted = true;
                Ok(Attempt::Acquired(lease))
            }
            Ok(Attempt::Held { expires_in }) if self.joined => {
                let third = self.request.ttl().get() / 3;
                Ok(Attempt::Held {
                    expires_in: Some(expires_in.map_or(third, |d| d.min(third))),
                })
            }
            other => other,
        }
    }
}

impl Drop for LineWaiter<'_> {
    fn drop(&mut self) {
        if self.granted || self.seq == 0 {
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
            Some(self.owner),
            Instant::now() + self.request.ttl().get(),
        );
    }
}

impl Client {
    /// Takes `member` (if not empty) out of the line of `keys` with its
    /// standing offer, passing on a hand-off reserved for it, and frees
    /// the lock if `owner` holds it (an attempt's unknown outcome, or a
    /// hand-off the wait did not take) or if it holds the grant of
    /// `fence` (a hand-off announced to a wait that had ended). Returns
    /// whether it freed the lock.
    pub(crate) async fn leave(
        &self,
        keys: &Keys,
        member: &str,
        owner: Option<OwnerToken>,
        fence: Option<u64>,
    ) -> Result<bool, LockError> {
        let mut call = prepare(&LEAVE);
        call.0.key(&keys.lock).key(&keys.queue).key(&keys.next);
        call.0
            .key(&keys.watchers)
            .arg(member)
            .arg(owner.map(|o| o.encode()).unwrap_or_default())
            .arg(fence.map(|f| f.to_string()).unwrap_or_default());
        self.handoff_tail(&mut call, keys);
        let (freed,): (i64,) = self.invoke("leave", &call).await?;
        Ok(freed == 1)
    }
}
