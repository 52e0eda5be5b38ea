//! The last step of every command that reached the store: the locker is
//! closed before `distlock` exits, whatever the exit (success, an error, a
//! `--wait` that ran out, `--no-wait` on a held name, a signal, a lost
//! lease), and within a bound, so a hung store cannot hang `distlock`.
//!
//! Closing loses and releases whatever is still held, finishes the
//! background clean-ups (a dropped guard's release, a cancelled waiter's
//! queue entry, the undo of an acquire whose reply was lost) and closes the
//! connections ([`Locker::close`]). Exiting without it leaves those entries
//! on the store, blocking the name until their TTL runs out.

use std::time::Duration;

use distlock::Locker;

use super::exit::one_line;

/// How long `distlock` waits for its clean-up before exiting anyway:
/// [`Locker::CLOSE_LIMIT`] for background releases, and as long again for
/// the backend's own clean-ups and connections (the default operation
/// timeout of the slowest stores, 5 s). What is left then expires with its
/// TTL. Signals that come meanwhile are caught and do not cut it short; only
/// SIGKILL does.
pub(crate) const CLOSE_BOUND: Duration = Locker::CLOSE_LIMIT.saturating_mul(2);

/// Closes `locker` within [`CLOSE_BOUND`], saying on stderr what could not
/// be finished.
pub(crate) async fn close(locker: &Locker) {
    match tokio::time::timeout(CLOSE_BOUND, locker.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!(
            "distlock: warning: closing the store failed: {}; what it still held expires with its TTL",
            one_line(&e)
        ),
        Err(_) => eprintln!(
            "distlock: warning: the store did not finish closing within {CLOSE_BOUND:?}; \
             what it still held expires with its TTL"
        ),
    }
}
