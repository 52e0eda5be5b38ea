//! The Lua scripts: each operation is one script, so one atomic step and one
//! round trip. Sent with `EVALSHA`, loaded again after `NOSCRIPT` (a
//! restarted server forgets its script cache).

use std::sync::LazyLock;

use redis::Script;

/// `next_fence`: advances a fence counter, above the floor and the clock.
const FENCE: &str = include_str!("scripts/fence.lua");
/// `is_lease`: whether a stored value belongs to a lease.
const LEASE: &str = include_str!("scripts/lease.lua");
/// `wake_next`, `wake_watchers`, `freed`: the line and the watchers.
const LINE: &str = include_str!("scripts/line.lua");
/// `now_ms`, `purge_expired`, `permits_live_until`: semaphore slots.
const PERMITS: &str = include_str!("scripts/permits.lua");

fn with(parts: &[&str], body: &str) -> Script {
    Script::new(&format!("{}\n{body}", parts.join("\n")))
}

macro_rules! script {
    ($name:ident = [$($part:ident),*] $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| with(&[$($part),*], include_str!(concat!("scripts/", $file))));
    };
}

script!(ACQUIRE = [FENCE, LINE] "acquire.lua");
script!(RENEW = [LEASE, PERMITS] "renew.lua");
script!(RELEASE = [LEASE, LINE] "release.lua");
script!(LEAVE = [LINE] "leave.lua");
script!(INSPECT = [] "inspect.lua");
script!(FORCE_RELEASE = [FENCE, LINE] "force_release.lua");
script!(WATCH = [LINE] "watch.lua");
script!(PERMIT_ACQUIRE = [FENCE, PERMITS] "permit_acquire.lua");
script!(PERMIT_RELEASE = [LEASE, LINE, PERMITS] "permit_release.lua");
script!(PERMIT_INSPECT = [PERMITS] "permit_inspect.lua");
script!(PERMIT_LEAVE = [LINE] "permit_leave.lua");
script!(RAISE_FLOOR = [] "raise_floor.lua");
script!(FENCED_WRITE = [] "fenced_write.lua");
