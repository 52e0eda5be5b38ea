//! Work that outlives a call: undoing an acquire (of a lock, a permit or a
//! reader-writer share) whose reply was lost, passing on hand-offs for waits that ended,
//! checking leases after a resubscription. Clean-ups owed to the store run
//! through the client's `Cleanups`, which `close` finishes; the rest ends
//! when the client closes.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use lockcore::{Backoff, OwnerToken};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::client::Client;
use super::script::prepare;
use crate::keys::{Keys, PermitKeys, RwKeys};
use crate::locks::INSPECT;
use crate::permits::PERMIT_LEAVE;
use crate::wait::notify::{Checks, Event};

/// What an acquire whose outcome is unknown may have been granted.
pub(crate) enum Undo {
    /// The lock of `Keys`, for this owner token.
    Lock(Keys, OwnerToken),
    /// A slot of the semaphore of `PermitKeys`, for this owner token.
    Permit(PermitKeys, OwnerToken),
    /// A share of the reader-writer lock of `RwKeys`: its holder
    /// `"<access>:<owner>"`.
    Share(RwKeys, String),
}

/// An acquire in flight. Settled once its reply says what happened;
/// dropped unsettled (the reply was lost, or the caller's future was
/// dropped while the request was out), it undoes in the background
/// whatever the attempt may have been granted, until that would have
/// expired anyway.
pub(crate) struct Pending {
    client: Arc<Client>,
    undo: Option<Undo>,
    until: Instant,
}

impl Pending {
    pub(crate) fn new(client: Arc<Client>, undo: Undo, until: Instant) -> Self {
        Pending {
            client,
            undo: Some(undo),
            until,
        }
    }

    /// The outcome is known: nothing to undo.
    pub(crate) fn settled(pending: Option<Pending>) {
        if let Some(mut pending) = pending {
            pending.undo = None;
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        match self.undo.take() {
            Some(Undo::Lock(keys, owner)) => {
                self.client
                    .leave_later(keys, String::new(), Some(owner), self.until);
            }
            Some(Undo::Permit(keys, owner)) => {
                self.client.give_back_later(keys, owner, self.until);
            }
            Some(Undo::Share(keys, holder)) => {
                self.client
                    .leave_share_later(keys, String::new(), holder, self.until);
            }
            None => {}
        }
    }
}

impl Client {
    /// Frees the slot of the semaphore `keys` that `owner`'s attempt was
    /// granted, if any, in the background: retried while the server is
    /// unreachable, until `until` (when the permit has expired anyway) or
    /// the backend is dropped.
    pub(crate) fn give_back_later(
        self: &Arc<Self>,
        keys: PermitKeys,
        owner: OwnerToken,
        until: Instant,
    ) {
        let what = "giving back the permit of an acquire whose reply was lost";
        self.cleanups.retry(self.clone(), until, what, move |client| {
            let keys = keys.clone();
            async move {
                if client.commands.get().is_none() {
                    return Ok(()); // closed: the permit expires with its TTL
                }
                let mut call = prepare(&PERMIT_LEAVE);
                call.0.key(&keys.slots).key(&keys.holders).key(&keys.watchers);
                call.0.arg(owner.encode());
                let (freed,): (i64,) = client.invoke("give back permit", &call).await?;
                if freed == 1 {
                    tracing::debug!(key = %keys.slots, "gave back the permit of an acquire whose reply was lost");
                }
                Ok(())
            }
        });
    }

    /// [`leave`](Self::leave) in the background, retried while the server
    /// is unreachable, until `until` (when whatever it would remove has
    /// expired anyway) or the backend is dropped.
    pub(crate) fn leave_later(
        self: &Arc<Self>,
        keys: Keys,
        member: String,
        owner: Option<OwnerToken>,
        until: Instant,
    ) {
        let what = "freeing the lock of an acquire whose reply was lost";
        self.cleanups.retry(self.clone(), until, what, move |client| {
            let (keys, member) = (keys.clone(), member.clone());
            async move {
                if client.commands.get().is_none() {
                    return Ok(()); // closed: what it would undo expires
                }
                if client.leave(&keys, &member, owner, None).await? {
                    tracing::debug!(key = %keys.lock, "freed the lock of an acquire whose reply was lost");
                }
                Ok(())
            }
        });
    }
}

/// Handles what the notifier hands over, until the client closes or is
/// dropped: passes on hand-offs whose wake-up came after the wait had
/// ended, and checks leases whose eviction may have gone unheard.
pub(crate) async fn handle_events(
    mut events: mpsc::UnboundedReceiver<Event>,
    client: Weak<Client>,
    closing: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let event = tokio::select! {
            _ = closing.cancelled() => return,
            event = events.recv() => event,
        };
        let Some(event) = event else {
            return;
        };
        let Some(strong) = client.upgrade() else {
            return;
        };
        match event {
            Event::Orphan(orphan) => {
                let Some(keys) = Keys::from_lock_key(&strong.prefix, &orphan.lock_key) else {
                    continue;
                };
                if let Err(e) = strong
                    .leave(&keys, &orphan.member, None, orphan.fence)
                    .await
                {
                    tracing::debug!(key = %keys.lock, error = %e, "could not pass a hand-off on; its reservation lapses");
                }
            }
            Event::Check(checks) => {
                tasks.spawn(check_leases(client.clone(), checks, closing.clone()));
            }
        }
    }
}

/// Reads the lock key of each lease (64 in flight) and fires the loss
/// signal of every lease whose key no longer holds its `owner:fence`.
/// Leases the server could not be asked about are retried with backoff
/// until it answers, the subscription the check follows is gone (the next
/// one checks again), or the client closes (every lease is lost then).
async fn check_leases(client: Weak<Client>, checks: Checks, closing: CancellationToken) {
    let retry = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let mut pending = checks.leases;
    let mut era_checked = false;
    for attempt in 0_u32.. {
        let Some(strong) = client.upgrade() else {
            return;
        };
        if strong.notifier.subscription() != Some(checks.subscription) {
            return;
        }
        // The link may have moved to a promoted replica: if so, every
        // lease is lost at once, whatever its key says.
        if !era_checked {
            era_checked = tokio::select! {
                _ = closing.cancelled() => return,
                checked = strong.check_era() => checked.is_ok(),
            };
        }
        let looking = futures::stream::iter(pending)
            .map(
                |(lock_key, value, lost): (String, String, CancellationToken)| {
                    let strong = &strong;
                    async move {
                        let mut call = prepare(&INSPECT);
                        call.0.key(&lock_key);
                        let found = strong
                            .invoke::<(i64, Option<String>)>("lease check", &call)
                            .await;
                        (lock_key, value, lost, found)
                    }
                },
            )
            .buffer_unordered(64)
            .collect::<Vec<_>>();
        let looked_up = tokio::select! {
            _ = closing.cancelled() => return,
            looked_up = looking => looked_up,
        };
        drop(strong);
        pending = Vec::new();
        for (lock_key, value, lost, found) in looked_up {
            match found {
                Ok((_, held))
                    if held.as_deref().and_then(|v| v.split(' ').next()) == Some(&value) => {}
                Ok(_) => {
                    tracing::debug!(key = %lock_key, "lease found gone after a resubscription");
                    lost.cancel();
                }
                Err(_) => pending.push((lock_key, value, lost)),
            }
        }
        if pending.is_empty() && era_checked {
            return;
        }
        tokio::select! {
            _ = closing.cancelled() => return,
            _ = tokio::time::sleep(retry.delay(attempt)) => {}
        }
    }
}
