//! Shared stores: one per kind and test binary (or the external server a
//! variable names), cleaned up at exit; skipping a missing one in partial
//! local runs only.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use nix::sys::signal::Signal;

use super::{Kind, Store, process};
use crate::kit::env::partial_run_allowed;

pub(crate) type SharedSlot = OnceLock<Result<Arc<Store>, (io::ErrorKind, String)>>;

/// The one store of `kind` for this test binary: the external server if its
/// variable is set, else one launched with `start` on first use. A failure is
/// remembered, so every later caller fails at once with the same message.
pub(crate) fn shared_store(
    kind: Kind,
    slot: &'static SharedSlot,
    start: impl FnOnce() -> io::Result<Store>,
) -> io::Result<Arc<Store>> {
    let result = slot.get_or_init(|| {
        let store = match kind.external_url() {
            Some(url) => Store::external(kind, &url),
            None => start(),
        };
        match store {
            Ok(store) => {
                if let (Some(child_pid), Some(dir)) = (store.pid(), store.data_dir()) {
                    register_cleanup(child_pid, dir.to_owned());
                }
                Ok(Arc::new(store))
            }
            Err(e) => Err((e.kind(), e.to_string())),
        }
    });
    match result {
        Ok(store) => Ok(store.clone()),
        Err((kind, message)) => Err(io::Error::new(*kind, message.clone())),
    }
}

/// `shared()` for local partial runs: `None` (after a loud SKIP line) when the
/// store's binaries are missing and [`partial_run_allowed`]; otherwise the
/// store, or a panic saying what to install.
pub(crate) fn shared_or_skip(
    kind: Kind,
    shared: impl FnOnce() -> io::Result<Arc<Store>>,
) -> Option<Arc<Store>> {
    match shared() {
        Ok(store) => Some(store),
        Err(e) if e.kind() == io::ErrorKind::NotFound && partial_run_allowed() => {
            eprintln!(
                "SKIP: {kind} tests skipped (LOCK_TEST_PARTIAL=1): {e}\n\
                 SKIP: this is a partial run; install with `apt-get install {}` or run scripts/test-all.sh",
                kind.packages()
            );
            None
        }
        Err(e) => panic!("{kind} store unavailable: {e}"),
    }
}

static CLEANUP: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// Shared stores live in statics, which are never dropped: at process exit,
/// kill their process groups and delete their data dirs.
pub(crate) fn register_cleanup(pid: u32, dir: PathBuf) {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        extern "C" fn at_exit() {
            let entries = std::mem::take(&mut *CLEANUP.lock().unwrap_or_else(|p| p.into_inner()));
            for (pid, dir) in entries {
                let _ = process::signal_tree(pid, Signal::SIGKILL);
                let _ = fs::remove_dir_all(dir);
            }
        }
        // SAFETY: registering a plain extern "C" fn; it only signals and removes files.
        unsafe {
            libc::atexit(at_exit);
        }
    });
    CLEANUP
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((pid, dir));
}
