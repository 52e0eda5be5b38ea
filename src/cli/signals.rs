//! The signals that end `distlock` (SIGINT, SIGTERM, SIGHUP, SIGQUIT),
//! caught from before it connects until it exits, so that no exit path cuts
//! its clean-up short.
//!
//! Without a handler, a signal ends the process at once: a waiter's queued
//! entry, a release in flight or an acquire whose reply was lost stays on the
//! store and blocks the name until its TTL runs out. Caught, a signal drops
//! what `distlock` was doing (connecting, waiting for the lock, asking the
//! store), `hold` releases, `run` forwards it to its job; then the locker is
//! closed and `distlock` exits 128 + the signal. Once caught, a signal no
//! longer has its default action for the rest of the process, so every phase
//! must listen: all of them share this one set of streams.

use std::future::Future;
use std::io;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The caught signals, one stream each.
pub(crate) struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    /// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on.
    pub(crate) fn catch() -> io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal caught (its number). Cancel-safe: a signal is never
    /// lost by dropping this future.
    pub(crate) async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
        }
    }

    /// A signal caught and not yet received, if any, without waiting.
    pub(crate) async fn pending(&mut self) -> Option<i32> {
        tokio::time::timeout(std::time::Duration::ZERO, self.recv())
            .await
            .ok()
    }

    /// `work`'s output, or `Err(signal)` if a signal came first (`work` is
    /// then dropped: what it left to clean up is the locker's close's).
    pub(crate) async fn until<T>(&mut self, work: impl Future<Output = T>) -> Result<T, i32> {
        tokio::select! {
            biased;
            signal = self.recv() => Err(signal),
            done = work => Ok(done),
        }
    }
}

/// The signal's name, for messages: `SIGTERM`.
pub(crate) fn name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        other => format!("signal {other}"),
    }
}
