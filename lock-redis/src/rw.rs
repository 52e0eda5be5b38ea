//! Reader-writer locks: acquire, leave and watch, one Lua script each
//! (`rw/scripts/`), over keys of their own (`keys.rs`: [`RwKeys`]). A share
//! is kept the way a permit is (a sorted set of holder to expiry beside a
//! hash of holder to value), so the permit scripts inspect and release
//! shares, and the lock scripts' batch renew renews them. A waiting writer
//! leaves an intent in the store that keeps readers out (`rw/writer.rs`).

use std::sync::Arc;

use lockcore::backend::LockRequest;
use lockcore::backend::wait::Wakeup;
use lockcore::{Access, Attempt, FencingToken, Holder, Lease, LockError, LockName, OwnerToken};
use tokio::time::Instant;

use crate::connection::background::{Pending, Undo};
use crate::connection::client::Client;
use crate::connection::script::{prepare, script};
use crate::error;
use crate::fence::NEXT_FENCE;
use crate::fence::failover::ERA_CHECK;
use crate::keys::RwKeys;
use crate::locks::value::{parse_value, remaining};
use crate::permits::{PERMIT_INSPECT, SLOTS};
use crate::wait::LINE;

mod writer;

pub(crate) use writer::WriterWaiter;

script!(RW_ACQUIRE = [NEXT_FENCE, ERA_CHECK, SLOTS] include_str!("rw/scripts/rw_acquire.lua"));
script!(RW_LEAVE = [LINE] include_str!("rw/scripts/rw_leave.lua"));

/// How the store names a share: `"<access>:<owner>"`, unique by its owner
/// token, and telling a writer from readers without reading its value.
pub(crate) fn holder_id(access: Access, owner: OwnerToken) -> String {
    format!("{}:{}", access.as_str(), owner.encode())
}

/// The access of a share the store names `id`.
fn access_of(id: &str) -> Option<Access> {
    Access::parse(id.split_once(':')?.0)
}

impl Client {
    /// One attempt at `access` to the reader-writer lock `request.name()`;
    /// a waiting writer passes its `intent` id, refreshed while it is
    /// refused and removed with its grant. An attempt whose outcome is
    /// unknown (no reply, or this future dropped while the request was
    /// out) gives back in the background whatever share it may have been
    /// granted, as a lock's attempt does.
    pub(crate) async fn acquire_share(
        self: &Arc<Self>,
        request: &LockRequest,
        access: Access,
        intent: Option<&str>,
    ) -> Result<Attempt, LockError> {
        if let Some(expires_in) = self.failover.era.grants_wait() {
            return Ok(Attempt::Held {
                expires_in: Some(expires_in),
            });
        }
        let keys = self.rw_keys(request.name());
        let owner = OwnerToken::new();
        let ttl = request.ttl();
        let mut call = prepare(&RW_ACQUIRE);
        call.0
            .key(&keys.shares)
            .key(&keys.holders)
            .key(&keys.intents);
        call.0.key(&keys.fence).key(&keys.floor).key(&keys.era);
        call.0
            .arg(access.as_str())
            .arg(owner.encode())
            .arg(ttl.as_millis_ceil())
            .arg(request.label().as_str())
            .arg(self.failover.script_arg())
            .arg(intent.unwrap_or_default());
        let sent_at = request.now();
        let pending = Pending::new(
            self.clone(),
            Undo::Share(keys, holder_id(access, owner)),
            sent_at.mono() + ttl.get(),
        );
        let ((era, reply), replicated): ((String, Vec<i64>), _) = self
            .invoke_grant("acquire rw", &call, Some(pending))
            .await
            .map_err(|(e, _)| e)?;
        self.failover.saw(&era, &self.endpoint);
        match reply[..] {
            [1, fence] => {
                let fence = FencingToken::from_store(error::BACKEND, fence)?;
                let lease = Lease::granted(request, owner, fence, sent_at);
                if let Err(e) = replicated {
                    self.give_back(&lease).await;
                    return Err(e);
                }
                tracing::debug!(name = %request.name(), %fence, %access, "rw share acquired");
                Ok(Attempt::Acquired(
                    lease.with_loss_signal(self.failover.era.loss_signal()),
                ))
            }
            [0, expires_in] => Ok(Attempt::Held {
                expires_in: remaining(expires_in),
            }),
            _ => Err(error::unexpected(format!("acquire rw answered {reply:?}"))),
        }
    }

    /// Every live holder of the reader-writer lock `name`, with its access.
    pub(crate) async fn inspect_shares(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let keys = self.rw_keys(name);
        let mut call = prepare(&PERMIT_INSPECT);
        call.0.key(&keys.shares).key(&keys.holders);
        let live: Vec<(String, i64, Option<String>)> = self.invoke("inspect rw", &call).await?;
        live.into_iter()
            .filter_map(|(id, left, value)| Some((id, left, value?)))
            .map(|(id, left, value)| {
                let access = access_of(&id).ok_or_else(|| {
                    error::unexpected(format!(
                        "{} holds a holder distlock did not write",
                        keys.shares
                    ))
                })?;
                let stored = parse_value(&keys.holders, &value)?;
                Ok(stored.holder(remaining(left)).with_access(access))
            })
            .collect()
    }

    /// A wake-up at the next release of a share of `keys` or removal of
    /// an intent, or when the first share or intent expires.
    pub(crate) async fn watch_shares(&self, keys: &RwKeys) -> Result<Wakeup, LockError> {
        let expiring = [keys.shares.as_str(), keys.intents.as_str()];
        self.watch(&keys.shares, &keys.watchers, &expiring).await
    }

    /// Removes the intent `intent` and frees the share `holder` (either
    /// may be empty) of the reader-writer lock of `keys`, waking its
    /// watchers. Returns whether it freed a share.
    pub(crate) async fn leave_share(
        &self,
        keys: &RwKeys,
        intent: &str,
        holder: &str,
    ) -> Result<bool, LockError> {
        let mut call = prepare(&RW_LEAVE);
        call.0
            .key(&keys.shares)
            .key(&keys.holders)
            .key(&keys.intents);
        call.0.key(&keys.watchers).arg(intent).arg(holder);
        let (freed,): (i64,) = self.invoke("leave rw", &call).await?;
        Ok(freed == 1)
    }

    /// [`leave_share`](Self::leave_share) in the background, retried while
    /// the server is unreachable, until `until` (when what it would remove
    /// has expired anyway) or the backend is dropped.
    pub(crate) fn leave_share_later(
        self: &Arc<Self>,
        keys: RwKeys,
        intent: String,
        holder: String,
        until: Instant,
    ) {
        let what = "leaving a reader-writer lock (an intent, or an acquire whose reply was lost)";
        self.cleanups.retry(self.clone(), until, what, move |client| {
            let (keys, intent, holder) = (keys.clone(), intent.clone(), holder.clone());
            async move {
                if client.commands.get().is_none() {
                    return Ok(()); // closed: what it would remove expires
                }
                if client.leave_share(&keys, &intent, &holder).await? {
                    tracing::debug!(key = %keys.shares, "freed the share of an acquire whose reply was lost");
                }
                Ok(())
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_carry_their_access() {
        let owner = OwnerToken::new();
        for access in [Access::Read, Access::Write] {
            let id = holder_id(access, owner);
            assert_eq!(id, format!("{access}:{}", owner.encode()));
            assert_eq!(access_of(&id), Some(access));
        }
        for foreign in ["", "read", "0", "reader:x", ":x"] {
            assert_eq!(access_of(foreign), None, "{foreign:?}");
        }
    }
}
