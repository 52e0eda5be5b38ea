//! The Lua scripts: each lock operation is one script, so one atomic step
//! and one round trip. Sent with `EVALSHA`, loaded again after `NOSCRIPT`
//! (a restarted server forgets its script cache).

use std::sync::LazyLock;

use redis::Script;

const FENCE: &str = include_str!("scripts/fence.lua");

fn with_fence(body: &str) -> Script {
    Script::new(&format!("{FENCE}\n{body}"))
}

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| with_fence(include_str!("scripts/acquire.lua")));
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
pub(crate) static ABANDON: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/abandon.lua")));
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| with_fence(include_str!("scripts/force_release.lua")));
pub(crate) static FENCED_APPLY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_apply.lua")));
