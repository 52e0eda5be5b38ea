//! Waiters and wake-ups: the line in Redis (one waiter woken per hand-off),
//! watches, and the one pub/sub connection of a backend instance that
//! carries them (and the eviction notices of its leases, see
//! `notify/holds.rs`).

pub(crate) mod handoff;
pub(crate) mod line;
pub(crate) mod notify;
mod watch;

use crate::connection::script::script;
use crate::fence::NEXT_FENCE;
use crate::fence::failover::ERA_CHECK;

pub(crate) use line::LineWaiter;

/// `wake_next`, `wake_watchers`, `freed`: the line and the watchers, shared
/// by every script that frees or claims a lock.
pub(crate) const LINE: &str = include_str!("wait/scripts/line.lua");

/// `grant_lock`, `record_offer`, `offer_grant`, `grant_from_tail`: the
/// hand-off grant on a waiter's standing offer (after `NEXT_FENCE`,
/// `ERA_CHECK` and `LINE`).
pub(crate) const HANDOFF: &str = include_str!("wait/scripts/handoff.lua");

script!(LEAVE = [NEXT_FENCE, ERA_CHECK, LINE, HANDOFF] include_str!("wait/scripts/leave.lua"));
script!(WATCH = [LINE] include_str!("wait/scripts/watch.lua"));
