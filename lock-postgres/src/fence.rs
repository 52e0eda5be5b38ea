//! Fences: the sequence's values as fencing tokens, the fence floor
//! (`floor.rs`), the floor raised after a failover (`failover.rs`), and resource-side fencing in the caller's transaction
//! (`resource.rs`).

pub(crate) mod failover;
mod floor;
mod resource;

use lockcore::{FencingToken, LockError};

pub use resource::{ResourceFence, fenced_write, fenced_write_slot};

use crate::error;

/// A fence as the tables store it, as a fencing token (a non-positive one
/// means the table was edited by hand).
pub(crate) fn fence_token(value: i64) -> Result<FencingToken, LockError> {
    u64::try_from(value)
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| {
            error::corrupt(format!(
                "the lock table holds fence {value}, not a positive number"
            ))
        })
}

/// The fence as stored, if it could be one of ours (sequences stay below
/// `i64::MAX`).
pub(crate) fn db_fence(fence: FencingToken) -> Option<i64> {
    i64::try_from(fence.get()).ok()
}
