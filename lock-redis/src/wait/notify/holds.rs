//! Evictions: the leases an instance holds, heard of on `<prefix>evict`,
//! and checked against the store whenever a subscription is (re-)established.

use std::sync::Arc;

use lockcore::{FencingToken, OwnerToken};
use tokio_util::sync::CancellationToken;

use super::{Checks, Event, Held, Link, Notifier};

/// One lease (or acquire attempt) listening for its eviction. Registered
/// before the acquire is sent; kept in the granted lease (as its
/// extension) and unregistered when the last copy of the lease is dropped.
pub(crate) struct HoldWatch {
    notifier: Arc<Notifier>,
    owner: OwnerToken,
    /// The subscription at registration, if any.
    since: Option<u64>,
    lost: CancellationToken,
}

impl HoldWatch {
    /// The acquire was granted `fence`; `lost` is the lease's loss signal
    /// (from the era the grant was made in), which from now on also fires
    /// on its eviction, and at once if one was heard since registration.
    /// If the instance was not subscribed all along since registration, an
    /// eviction may have gone unheard: the lease is checked at once.
    pub(crate) fn granted(
        &self,
        fence: FencingToken,
        lost: CancellationToken,
    ) -> CancellationToken {
        let notifier = &self.notifier;
        let mut holds = notifier.holds();
        let subscription = holds.subscription;
        if self.lost.is_cancelled() {
            lost.cancel();
        }
        if let Some(held) = holds.leases.get_mut(&self.owner) {
            held.fence = Some(fence);
            held.lost = lost.clone();
            if let Some(subscription) = subscription
                && self.since != Some(subscription)
            {
                let lease = (
                    held.lock_key.clone(),
                    format!("{}:{fence}", self.owner.encode()),
                    lost.clone(),
                );
                drop(holds);
                notifier.check(subscription, vec![lease]);
            }
        }
        lost
    }
}

impl Drop for HoldWatch {
    fn drop(&mut self) {
        self.notifier.holds().leases.remove(&self.owner);
    }
}

impl Notifier {
    /// Registers an acquire attempt by `owner` on `lock_key`, before it is
    /// sent, so that an eviction of its grant is heard (see [`HoldWatch`]).
    pub(crate) fn watch_hold(self: &Arc<Self>, lock_key: &str, owner: OwnerToken) -> HoldWatch {
        self.start();
        let lost = self.leases.child_token();
        let mut holds = self.holds();
        holds.leases.insert(
            owner,
            Held {
                lock_key: lock_key.to_owned(),
                fence: None,
                lost: lost.clone(),
            },
        );
        HoldWatch {
            notifier: self.clone(),
            owner,
            since: holds.subscription,
            lost,
        }
    }

    /// Whether a lease of this instance holds the grant of `fence` on
    /// `lock_key`.
    pub(super) fn holds_grant(&self, lock_key: &str, fence: u64) -> bool {
        self.holds()
            .leases
            .values()
            .any(|held| held.lock_key == lock_key && held.fence.is_some_and(|f| f.get() == fence))
    }

    /// The current subscription's number, while subscribed.
    pub(crate) fn subscription(&self) -> Option<u64> {
        self.holds().subscription
    }

    pub(super) fn check(
        &self,
        subscription: u64,
        leases: Vec<(String, String, CancellationToken)>,
    ) {
        if !leases.is_empty() {
            let _ = self.events.send(Event::Check(Checks {
                subscription,
                leases,
            }));
        }
    }

    /// Handles one message on the eviction channel, `<lock key>
    /// <owner>:<fence>`: fires the loss signal of the lease it names, if
    /// this instance holds it. (Names may contain spaces; the value cannot.)
    pub(super) fn evicted(&self, payload: &str) {
        let Some((lock_key, value)) = payload.rsplit_once(' ') else {
            return;
        };
        let Some((owner, fence)) = value.split_once(':') else {
            return;
        };
        let (Some(owner), Ok(fence)) = (OwnerToken::decode(owner), fence.parse::<u64>()) else {
            return;
        };
        let holds = self.holds();
        let Some(held) = holds.leases.get(&owner) else {
            return; // another instance's lease
        };
        if held.lock_key == lock_key && held.fence.is_none_or(|f| f.get() == fence) {
            tracing::debug!(key = lock_key, fence, "lease evicted by a forced release");
            held.lost.cancel();
        }
    }

    /// Subscription `number` is up: every lease granted so far may have
    /// missed its eviction message, so each is checked against the store.
    pub(super) fn subscribed(&self, number: u64, wake: bool) {
        let mut holds = self.holds();
        holds.subscription = Some(number);
        let leases = holds
            .leases
            .iter()
            .filter(|(_, held)| !held.lost.is_cancelled())
            .filter_map(|(owner, held)| {
                let value = format!("{}:{}", owner.encode(), held.fence?);
                Some((held.lock_key.clone(), value, held.lost.clone()))
            })
            .collect();
        drop(holds);
        self.check(number, leases);
        self.link.send_replace(Link::Up { wake });
    }
}
