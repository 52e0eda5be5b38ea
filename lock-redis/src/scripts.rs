//! The Lua scripts: each lock operation is one script, so one atomic step
//! and one round trip. Sent with `EVALSHA`, loaded again after `NOSCRIPT`
//! (a restarted server forgets its script cache).

use std::sync::LazyLock;

use redis::Script;

/// `next_fence`: advances a name's fence counter.
const FENCE: &str = include_str!("scripts/fence.lua");
/// `wake_next`: hands a free lock to the first waiter in line.
const LINE: &str = include_str!("scripts/line.lua");

fn with(parts: &[&str], body: &str) -> Script {
    Script::new(&format!("{}\n{body}", parts.join("\n")))
}

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| with(&[FENCE, LINE], include_str!("scripts/acquire.lua")));
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| with(&[LINE], include_str!("scripts/release.lua")));
pub(crate) static LEAVE: LazyLock<Script> =
    LazyLock::new(|| with(&[LINE], include_str!("scripts/leave.lua")));
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| with(&[FENCE, LINE], include_str!("scripts/force_release.lua")));
pub(crate) static FENCED_APPLY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_apply.lua")));
