//! Several locks in one script (`LockBackend::try_acquire_each`): every
//! name, or none of them and the name found held. Each name is judged and
//! granted as the lock's own acquire judges and grants a caller that will
//! not wait (`locks/scripts/claim.lua`, shared by both scripts), and each
//! lease is its own: its own owner token, fence, eviction watch and undo.

use std::sync::Arc;

use lockcore::backend::{LockRequest, Moment, check_each};
use lockcore::{AttemptEach, FencingToken, Lease, LockError, OwnerToken};

use super::CLAIM;
use crate::connection::background::{Pending, Undo};
use crate::connection::client::Client;
use crate::connection::script::{prepare, script};
use crate::error::{self, BACKEND};
use crate::fence::NEXT_FENCE;
use crate::fence::failover::ERA_CHECK;
use crate::keys::{self, Keys};
use crate::locks::value::remaining;
use crate::wait::{HANDOFF, LINE};

script!(ACQUIRE_EACH = [NEXT_FENCE, ERA_CHECK, LINE, HANDOFF, CLAIM] include_str!("scripts/acquire_each.lua"));

impl Client {
    /// One script over every name's keys: every lock of `requests` (in
    /// their order), or none and [`AttemptEach::Held`]. On a Redis Cluster
    /// one script reaches one slot only: names whose keys do not all share
    /// one are answered [`LockError::Unsupported`] before any I/O, and the
    /// caller takes them one by one. A grant whose reply was lost (or whose
    /// future was dropped while the request was out) is undone in the
    /// background, each lease on its own, as a lock's attempt is.
    pub(crate) async fn acquire_each(
        self: &Arc<Self>,
        requests: &[LockRequest],
    ) -> Result<AttemptEach, LockError> {
        check_each(requests)?;
        let keys: Vec<Keys> = requests.iter().map(|r| self.keys(r.name())).collect();
        if self.commands.is_cluster() && !one_slot(&keys) {
            return Err(LockError::Unsupported {
                backend: BACKEND,
                operation: "try_acquire_each",
            });
        }
        if let Some(expires_in) = self.failover.era.grants_wait() {
            return Ok(AttemptEach::Held {
                name: requests[0].name().clone(),
                expires_in: Some(expires_in),
            });
        }
        let owners: Vec<OwnerToken> = requests.iter().map(|_| OwnerToken::new()).collect();
        let mut call = prepare(&ACQUIRE_EACH);
        call.0.arg(self.failover.script_arg());
        for ((request, keys), owner) in requests.iter().zip(&keys).zip(&owners) {
            call.0.key(&keys.lock).key(&keys.fence).key(&keys.queue);
            call.0.key(&keys.next).key(&keys.floor).key(&keys.era);
            call.0
                .arg(owner.encode())
                .arg(request.ttl().as_millis_ceil())
                .arg(request.label().as_str());
        }
        // Listening for an eviction of each grant starts before it exists.
        let watches: Vec<_> = keys
            .iter()
            .zip(&owners)
            .map(|(keys, owner)| self.notifier.watch_hold(&keys.lock, *owner))
            .collect();
        let sent: Vec<Moment> = requests.iter().map(LockRequest::now).collect();
        let pending: Vec<Pending> = requests
            .iter()
            .zip(keys)
            .zip(&owners)
            .zip(&sent)
            .map(|(((request, keys), owner), sent_at)| {
                let until = sent_at.mono() + request.ttl().get();
                Pending::new(self.clone(), Undo::Lock(keys, *owner), until)
            })
            .collect();
        let ((era, reply), replicated): ((String, Vec<i64>), _) =
            match self.invoke_replicated("acquire each", &call).await {
                Ok(reply) => reply,
                Err((e, maybe_ran)) => {
                    if !maybe_ran {
                        settled(pending);
                    }
                    return Err(e);
                }
            };
        self.failover.saw(&era, &self.endpoint);
        match reply.split_first() {
            Some((1, fences)) if fences.len() == requests.len() => {
                // Until every lease is made, an error drops `pending`,
                // which frees every grant.
                let mut leases = Vec::with_capacity(requests.len());
                for (((request, owner), sent_at), &fence) in
                    requests.iter().zip(&owners).zip(sent).zip(fences)
                {
                    let fence = FencingToken::from_store(BACKEND, fence)?;
                    leases.push(Lease::granted(request, *owner, fence, sent_at));
                }
                settled(pending);
                if let Err(e) = replicated {
                    futures::future::join_all(leases.iter().map(|l| self.give_back(l))).await;
                    return Err(e);
                }
                tracing::debug!(names = leases.len(), "acquired every lock of a multi-lock");
                Ok(AttemptEach::Acquired(
                    leases
                        .into_iter()
                        .zip(watches)
                        .map(|(lease, watch)| {
                            let lost =
                                watch.granted(lease.fence(), self.failover.era.loss_signal());
                            lease.with_loss_signal(lost).with_extension(watch)
                        })
                        .collect(),
                ))
            }
            Some((0, &[at, expires_in])) => {
                let request = usize::try_from(at)
                    .ok()
                    .and_then(|i| requests.get(i.checked_sub(1)?))
                    .ok_or_else(|| error::unexpected(format!("acquire each named name {at}")))?;
                settled(pending);
                Ok(AttemptEach::Held {
                    name: request.name().clone(),
                    expires_in: remaining(expires_in),
                })
            }
            _ => Err(error::unexpected(format!(
                "acquire each answered {reply:?} for {} names",
                requests.len()
            ))),
        }
    }
}

/// The outcome of every attempt is known: nothing to undo.
fn settled(pending: Vec<Pending>) {
    for one in pending {
        Pending::settled(Some(one));
    }
}

/// Whether every name's keys live in one Redis Cluster slot (each name's
/// own keys share its hash tag, so its lock key says).
fn one_slot(keys: &[Keys]) -> bool {
    let mut slots = keys.iter().map(|k| keys::key_slot(&k.lock));
    let first = slots.next();
    slots.all(|slot| Some(slot) == first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::LockName;

    #[test]
    fn names_share_a_slot_only_by_their_tags() {
        let keys = |names: &[&str]| -> Vec<Keys> {
            names
                .iter()
                .map(|n| Keys::new(keys::DEFAULT_PREFIX, &LockName::new(*n).unwrap()))
                .collect::<Vec<_>>()
        };
        assert!(one_slot(&keys(&["a"])));
        // "foo" and "user1000" are in slots 12182 and 3443.
        assert!(!one_slot(&keys(&["foo", "user1000"])));
        // "n83" and "n2500" collide: both in slot 2662.
        assert!(one_slot(&keys(&["n83", "n2500"])));
        assert!(!one_slot(&keys(&["n83", "n2500", "foo"])));
    }
}
