//! Fencing: the counters every grant advances (`next_fence`, prepended to
//! the scripts that grant), the fence floor raised after a restore, the
//! failover check every grant makes (`failover.rs`), and fenced writes to
//! data kept in Redis.

pub(crate) mod failover;
mod fenced_write;
mod floor;

use crate::connection::script::script;

pub use fenced_write::fenced_write;

/// The largest fence Redis counts exactly: Lua holds numbers as doubles.
pub(crate) const MAX_FENCE: u64 = (1 << 53) - 1;

/// `next_fence`: advances a fence counter, above the floor and the clock.
pub(crate) const NEXT_FENCE: &str = include_str!("fence/scripts/fence.lua");

script!(RAISE_FLOOR = [] include_str!("fence/scripts/raise_floor.lua"));
script!(FENCED_WRITE = [] include_str!("fence/scripts/fenced_write.lua"));
