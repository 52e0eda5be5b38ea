//! Semaphores: the slots of a name are rows `(kind = 'permit', name, slot)`
//! of the lease table, each with a fence of its own; they are granted,
//! renewed, released and judged exactly as locks are (`locks.rs`), a lock
//! being a semaphore of one slot. What is the semaphores' own: the permit
//! count every holder of a name must agree on, and which slot is free.

use std::collections::HashSet;

use lockcore::backend::{LockRequest, check_permits};
use lockcore::{Attempt, Holder, LockError, LockName};

use crate::connection::Client;
use crate::keys::Kind;
use crate::locks::Row;

impl Client {
    /// One attempt at a free slot of semaphore `request.name()` of `permits`.
    pub(crate) async fn try_grant_permit(
        &self,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        check_permits(request.name(), permits)?;
        self.try_grant(Kind::Permit, request, permits).await
    }

    /// The live holders of semaphore `name`, with their slots.
    pub(crate) async fn permit_holders(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        self.holders(Kind::Permit, name).await
    }
}

/// The first free slot of `name` out of `permits`, given its `live` rows;
/// `None` when every slot is taken.
///
/// # Errors
/// [`LockError::PermitsMismatch`] when a live holder took its slot out of
/// another count: two counts for one name would let more in than either.
pub(crate) fn free_slot(
    name: &LockName,
    live: &[Row],
    permits: u32,
) -> Result<Option<i64>, LockError> {
    if let Some(other) = live.iter().find(|r| r.permits != i64::from(permits)) {
        return Err(LockError::PermitsMismatch {
            name: name.clone(),
            requested: permits,
            existing: u32::try_from(other.permits).unwrap_or(u32::MAX),
        });
    }
    let taken: HashSet<i64> = live.iter().map(|r| r.slot).collect();
    Ok((0..i64::from(permits)).find(|s| !taken.contains(s)))
}
