//! Semaphores: acquire and inspect of permits, one Lua script each
//! (`permits/scripts/`). Renewing and releasing a permit go through the
//! lock scripts' batch renew and release (`locks.rs`), which take either.
//! Reader-writer shares are kept like permits (`rw.rs`): the slot helpers,
//! the release and the inspect script serve them too.

use std::sync::Arc;

use lockcore::backend::LockRequest;
use lockcore::{Attempt, FencingToken, Holder, Lease, LockError, LockName, OwnerToken};

use crate::connection::background::{Pending, Undo};
use crate::connection::client::Client;
use crate::connection::script::{prepare, script};
use crate::error;
use crate::fence::NEXT_FENCE;
use crate::fence::failover::ERA_CHECK;
use crate::locks::IS_LEASE;
use crate::locks::value::{parse_value, remaining};
use crate::wait::LINE;

/// `now_ms`, `purge_expired`, `permits_live_until`: semaphore slots.
pub(crate) const SLOTS: &str = include_str!("permits/scripts/permits.lua");

script!(PERMIT_ACQUIRE = [NEXT_FENCE, ERA_CHECK, SLOTS] include_str!("permits/scripts/permit_acquire.lua"));
script!(PERMIT_RELEASE = [IS_LEASE, LINE, SLOTS] include_str!("permits/scripts/permit_release.lua"));
script!(PERMIT_INSPECT = [SLOTS] include_str!("permits/scripts/permit_inspect.lua"));
script!(PERMIT_LEAVE = [LINE] include_str!("permits/scripts/permit_leave.lua"));

impl Client {
    /// One attempt at a permit of the semaphore `request.name()`. An
    /// attempt whose outcome is unknown (no reply, or this future dropped
    /// while the request was out) gives back in the background whatever
    /// slot it may have been granted, as a lock's attempt does.
    pub(crate) async fn acquire_permit(
        self: &Arc<Self>,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        if let Some(expires_in) = self.failover.era.grants_wait() {
            return Ok(Attempt::Held {
                expires_in: Some(expires_in),
            });
        }
        let keys = self.permit_keys(request.name());
        let owner = OwnerToken::new();
        let ttl = request.ttl();
        let mut call = prepare(&PERMIT_ACQUIRE);
        call.0.key(&keys.slots).key(&keys.holders);
        call.0.key(&keys.fence).key(&keys.floor).key(&keys.era);
        call.0
            .arg(owner.encode())
            .arg(ttl.as_millis_ceil())
            .arg(permits)
            .arg(request.label().as_str())
            .arg(self.failover.script_arg());
        let sent_at = request.now();
        let pending = Pending::new(
            self.clone(),
            Undo::Permit(keys.clone(), owner),
            sent_at.mono() + ttl.get(),
        );
        let ((era, reply), replicated): ((String, Vec<i64>), _) = self
            .invoke_grant("acquire permit", &call, Some(pending))
            .await
            .map_err(|(e, _)| e)?;
        self.failover.saw(&era, &self.endpoint);
        match reply[..] {
            [1, fence, slot] => {
                let fence = FencingToken::from_store(error::BACKEND, fence)?;
                let slot = u32::try_from(slot)
                    .map_err(|_| error::unexpected(format!("permit slot {slot}")))?;
                let lease = Lease::granted(request, owner, fence, sent_at).with_slot(slot);
                if let Err(e) = replicated {
                    self.give_back(&lease).await;
                    return Err(e);
                }
                tracing::debug!(name = %request.name(), %fence, slot, "permit acquired");
                Ok(Attempt::Acquired(
                    lease.with_loss_signal(self.failover.era.loss_signal()),
                ))
            }
            [0, expires_in] => Ok(Attempt::Held {
                expires_in: remaining(expires_in),
            }),
            [-1, existing] => Err(LockError::PermitsMismatch {
                name: request.name().clone(),
                requested: permits,
                existing: u32::try_from(existing).unwrap_or(u32::MAX),
            }),
            _ => Err(error::unexpected(format!(
                "acquire permit answered {reply:?}"
            ))),
        }
    }

    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let keys = self.permit_keys(name);
        let mut call = prepare(&PERMIT_INSPECT);
        call.0.key(&keys.slots).key(&keys.holders);
        let live: Vec<(u32, i64, Option<String>)> = self.invoke("inspect permits", &call).await?;
        live.into_iter()
            .filter_map(|(slot, left, value)| Some((slot, left, value?)))
            .map(|(slot, left, value)| {
                let stored = parse_value(&keys.holders, &value)?;
                Ok(stored.holder(remaining(left)).with_slot(slot))
            })
            .collect()
    }
}
