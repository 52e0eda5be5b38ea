//! A writer that waits for a reader-writer lock, and its intent: the row
//! that keeps new readers out while it waits.
//!
//! The writer waits in the one wait loop (`lockcore::backend::wait`) with
//! [`WriterWaits`]: each attempt either grants the write (deleting the
//! intent in the same transaction) or makes the intent, or moves its
//! expiry a TTL on once a third of the TTL has passed (other refused
//! attempts write nothing); a refused attempt asks to be retried by then,
//! so the intent outlives its writer's last attempt by at most a TTL. The
//! intent has a presence file of its own, whose `flock` this client keeps
//! in [`Intents`] while the writer waits: a writer whose process dies
//! leaves an intent that every attempt sees gone at once, and one stopped
//! (`SIGSTOP`) leaves one that lapses within its TTL.
//!
//! When the writer stops waiting without the write (its deadline, an
//! error, its future dropped), the `flock` is let go at once (so readers
//! are admitted from then on, and woken by the close), and the row and
//! file are removed in the background through the client's `Cleanups`, by
//! the same undo as a grant cut short (`locks/undo.rs`). Closing the client
//! lets go of every intent it keeps.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::Duration;

use lockcore::backend::wait::{Waiter, Wakeup};
use lockcore::backend::{LockRequest, async_trait, timed};
use lockcore::{Access, Attempt, LockError, OwnerToken};

use crate::connection::Client;
use crate::error::BACKEND;
use crate::keys::Kind;
use crate::locks::clock;
use crate::locks::grant::Written;
use crate::locks::undo::Undo;

/// An intent's expiry moves a TTL on once this share of the TTL is left:
/// it outlives its writer's last attempt by at most a TTL, and a waiting
/// writer writes at most once per third of a TTL to keep it.
pub(crate) const REFRESH_AT_LEFT: f64 = 2.0 / 3.0;

/// A writer's intent in the lock file, made by one of its attempts.
#[derive(Debug)]
pub(crate) struct Intent {
    fence: i64,
    owner: OwnerToken,
    /// Its expiry as last written (boot-clock nanoseconds).
    expires_at: i64,
    client: Weak<Client>,
    /// Armed until the intent's row went with the writer's grant: dropped
    /// armed, it removes the row and then the presence file.
    undo: Option<Undo>,
}

impl Intent {
    /// The intent `written` for the writer of `request`, its presence
    /// file kept by `client`.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the client was closed meanwhile (the
    /// intent is then let go at once).
    pub(crate) fn new(
        client: &Client,
        request: &LockRequest,
        written: Written,
    ) -> Result<Intent, LockError> {
        let ttl = request.ttl().get();
        let undo = Undo::arm(
            client,
            Kind::Intent,
            request.name(),
            written.slot,
            written.owner,
            written.fence,
            ttl,
        );
        let intent = Intent {
            fence: written.fence,
            owner: written.owner,
            expires_at: written.expires_at,
            client: client.me.clone(),
            undo: Some(undo.committed()),
        };
        if let Some(file) = written.file
            && !client.intents.keep(written.fence, file.flock)
        {
            // Closed meanwhile: the intent goes at once.
            client.open()?;
        }
        Ok(intent)
    }

    /// Its fence (also its row's slot, and its presence file's name).
    pub(crate) fn fence(&self) -> i64 {
        self.fence
    }

    pub(crate) fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// How long until its expiry is due to move a TTL on (for a TTL of
    /// `ttl`), as last written: once a third of it has passed. `None` once
    /// due.
    pub(crate) fn due_in(&self, now: i64, ttl: Duration) -> Option<Duration> {
        let due_at = self.expires_at - clock::nanos(ttl.mul_f64(REFRESH_AT_LEFT));
        (due_at > now).then(|| clock::duration(due_at - now))
    }

    /// Its expiry moved to `expires_at`.
    pub(crate) fn moved(&mut self, expires_at: i64) {
        self.expires_at = expires_at;
    }

    /// Its row went with the writer's grant, committed: its presence file
    /// goes too, which wakes the readers watching it.
    pub(crate) fn granted(mut self, client: &Client) {
        client.intents.let_go(self.fence);
        if let Some(undo) = self.undo.take() {
            undo.disarm();
        }
        if let Some(presence) = &client.presence {
            presence.remove(u64::try_from(self.fence).unwrap_or(0));
        }
    }
}

impl Drop for Intent {
    /// The writer gave up: its `flock` goes now, its row and file after.
    fn drop(&mut self) {
        if let Some(client) = self.client.upgrade() {
            client.intents.let_go(self.fence);
        }
    }
}

/// The presence files of a client's intents, by fence, whose `flock`s say
/// their writers still wait.
#[derive(Debug, Default)]
pub(crate) struct Intents {
    state: Mutex<IntentFiles>,
}

#[derive(Debug, Default)]
struct IntentFiles {
    closed: bool,
    files: HashMap<i64, File>,
}

impl Intents {
    fn lock(&self) -> MutexGuard<'_, IntentFiles> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the presence file of intent `fence` open; `false` (and the
    /// file closed) once the client is closed.
    fn keep(&self, fence: i64, file: File) -> bool {
        let mut state = self.lock();
        if !state.closed {
            state.files.insert(fence, file);
        }
        !state.closed
    }

    /// Closes the presence file of intent `fence`: its writer no longer waits.
    fn let_go(&self, fence: i64) {
        let file = self.lock().files.remove(&fence);
        drop(file);
    }

    /// Closes every presence file, and keeps none from here on: the client
    /// is closing, none of its writers waits any more.
    pub(crate) fn close(&self) {
        let files = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.files)
        };
        drop(files);
    }
}

/// The wait of a writer: an attempt that leaves (or refreshes) its intent
/// when refused, in the one wait loop. Dropped (granted or not), it lets go
/// of whatever intent it still has.
pub(crate) struct WriterWaits<'a> {
    client: &'a Client,
    request: &'a LockRequest,
    intent: Option<Intent>,
}

impl<'a> WriterWaits<'a> {
    pub(crate) fn new(client: &'a Client, request: &'a LockRequest) -> Self {
        WriterWaits {
            client,
            request,
            intent: None,
        }
    }
}

#[async_trait]
impl Waiter for WriterWaits<'_> {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        self.client.watch(Kind::Rw, self.request.name()).await
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        if let Err(closed) = self.client.open() {
            self.intent = None;
            return Err(closed);
        }
        let attempt = self
            .client
            .grant_rw(self.request, Access::Write, Some(&mut self.intent));
        timed(BACKEND, "acquire", self.client.limit, attempt).await
    }
}
