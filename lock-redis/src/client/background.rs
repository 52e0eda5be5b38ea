//! Work that outlives a call: undoing an acquire whose reply was lost,
//! passing on hand-offs for waits that ended, checking leases after a
//! resubscription.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use lockcore::{Backoff, OwnerToken};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Client, prepare};
use crate::keys::Keys;
use crate::notify::{Checks, Event};
use crate::scripts;

impl Client {
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
                if client.leave(&keys, &member, owner).await? {
                    tracing::debug!(key = %keys.lock, "freed the lock of an acquire whose reply was lost");
                }
                Ok(())
            }
        });
    }
}

/// Handles what the notifier hands over, until the backend is dropped:
/// passes on hand-offs whose wake-up came after the wait had ended, and
/// checks leases whose eviction may have gone unheard.
pub(crate) async fn handle_events(
    mut events: mpsc::UnboundedReceiver<Event>,
    client: Weak<Client>,
) {
    while let Some(event) = events.recv().await {
        let Some(strong) = client.upgrade() else {
            return;
        };
        match event {
            Event::Orphan(orphan) => {
                let Some(keys) = Keys::from_lock_key(&strong.prefix, &orphan.lock_key) else {
                    continue;
                };
                if let Err(e) = strong.leave(&keys, &orphan.member, None).await {
                    tracing::debug!(key = %keys.lock, error = %e, "could not pass a hand-off on; its reservation lapses");
                }
            }
            Event::Check(checks) => {
                tokio::spawn(check_leases(client.clone(), checks));
            }
        }
    }
}

/// Reads the lock key of each lease (64 in flight) and fires the loss
/// signal of every lease whose key no longer holds its `owner:fence`.
/// Leases the server could not be asked about are retried with backoff
/// until it answers, the subscription the check follows is gone (the next
/// one checks again), or the backend is dropped.
async fn check_leases(client: Weak<Client>, checks: Checks) {
    let retry = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let mut pending = checks.leases;
    for attempt in 0_u32.. {
        let Some(strong) = client.upgrade() else {
            return;
        };
        if strong.notifier.subscription() != Some(checks.subscription) {
            return;
        }
        let looked_up: Vec<_> = futures::stream::iter(pending)
            .map(
                |(lock_key, value, lost): (String, String, CancellationToken)| {
                    let strong = &strong;
                    async move {
                        let mut call = prepare(&scripts::INSPECT);
                        call.0.key(&lock_key);
                        let found = strong
                            .invoke::<(i64, Option<String>)>("lease check", &call)
                            .await;
                        (lock_key, value, lost, found)
                    }
                },
            )
            .buffer_unordered(64)
            .collect()
            .await;
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
        if pending.is_empty() {
            return;
        }
        tokio::time::sleep(retry.delay(attempt)).await;
    }
}
