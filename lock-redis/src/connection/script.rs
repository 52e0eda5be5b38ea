//! How the Lua scripts are built and called: each operation is one script,
//! so one atomic step and one round trip. A script is its role's file with
//! the shared helpers it needs prepended (`next_fence`, `is_lease`, the line,
//! the slots); each role declares its own (`locks.rs`, `permits.rs`,
//! `fence.rs`, `wait.rs`). Sent with `EVALSHA`, loaded again after
//! `NOSCRIPT` (a restarted server forgets its script cache).

use redis::{Script, ScriptInvocation};

use super::commands;

/// The first line of a script that reaches keys of every slot its Redis
/// Cluster primary serves (Redis 7): its keys are passed as arguments,
/// since declared keys must share one slot; one declared key routes it.
pub(crate) const CROSS_SLOT: &str = "#!lua flags=allow-cross-slot-keys";

/// `body` with the helper `parts` before it.
pub(crate) fn with(parts: &[&str], body: &str) -> Script {
    Script::new(&format!("{}\n{body}", parts.join("\n")))
}

/// `script!(NAME = [HELPER, ...] include_str!("scripts/x.lua"));` declares
/// the script `NAME`, built on first use.
macro_rules! script {
    ($name:ident = [$($part:path),*] $body:expr) => {
        pub(crate) static $name: std::sync::LazyLock<redis::Script> =
            std::sync::LazyLock::new(|| crate::connection::script::with(&[$($part),*], $body));
    };
}
pub(crate) use script;

/// A script invocation and the nonce its reply must echo.
pub(crate) type Call = (ScriptInvocation<'static>, String);

/// A script invocation whose first argument is a fresh nonce.
pub(crate) fn prepare(script: &'static Script) -> Call {
    let nonce = commands::nonce();
    let mut invocation = script.prepare_invoke();
    invocation.arg(&nonce);
    (invocation, nonce)
}
