//! Every integration test of lock-sqlite but the conformance suite
//! (`tests/conformance.rs`) and the secrets check (`tests/secrets.rs`, which
//! installs a process-wide log capture), as modules of one test binary: one
//! link instead of one per file. Each module is one concern; none assumes
//! a process of its own (the fd checks of `close` look only at the files of
//! their own temp dir and at their own client's inotify instance).

mod presence;
mod support;

mod clocks;
mod close;
mod connect;
mod fencing;
mod locks;
mod multi;
mod permits;
mod restore;
mod rw;
mod scale;
mod schema;
mod wakeups;

/// Not a test: the helper processes of `support` (a writer to kill
/// mid-write, a holder, a holder that renews), started by the tests.
#[test]
#[ignore = "helper process, run by the tests themselves"]
fn sqlite_helper_process() {
    support::helper_main();
}
