//! `FencedRwResource`: the model of a resource shared through a
//! reader-writer lock, checking the tokens of reads and writes alike.

use std::fmt;
use std::sync::Mutex;

use crate::{FencingToken, StaleToken};

/// A value guarded by a reader-writer lock's fencing tokens, which come
/// from one counter for reads and writes ([`RwLock`](crate::RwLock)):
///
/// - a **write** is applied only if its token is not older than every token
///   the resource has seen, read or write. A reader with a larger token was
///   granted after the writer's grant, so the writer had lost the name:
///   a paused, stale writer is refused;
/// - a **read** is served only if its token is not older than the latest
///   applied write: a read that began before that write (a paused reader
///   whose share ran out while a writer came and went) is refused instead
///   of mixing old and new.
///
/// ```
/// use lockcore::{FencedRwResource, FencingToken};
///
/// let t = |n| FencingToken::new(n).unwrap();
/// let price = FencedRwResource::new(10_u32);
/// assert_eq!(price.read(t(1), |p| *p), Ok(10)); // a reader, token 1
/// price.write(t(3), |p| *p = 12).unwrap(); // a later writer, token 3
/// assert!(price.read(t(1), |p| *p).is_err()); // that read began before the write
/// assert!(price.read(t(4), |p| *p).is_ok()); // a read granted after it
/// assert!(price.write(t(2), |p| *p = 11).is_err()); // a stale writer
/// ```
pub struct FencedRwResource<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    value: T,
    /// The newest token seen, read or write.
    newest: Option<FencingToken>,
    /// The token of the latest applied write.
    written: Option<FencingToken>,
    refused: usize,
}

/// A read refused because it began before the latest write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale read with fencing token {token}: the resource was written with {written} since")]
pub struct StaleRead {
    /// The token of the refused read.
    pub token: FencingToken,
    /// The token of the latest write.
    pub written: FencingToken,
}

impl<T> FencedRwResource<T> {
    /// A resource holding `value`, no token seen yet.
    pub fn new(value: T) -> Self {
        FencedRwResource {
            state: Mutex::new(State {
                value,
                newest: None,
                written: None,
                refused: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads through `view` with a reader's (or the writer's) `token`.
    ///
    /// # Errors
    /// [`StaleRead`] when a write with a newer token was applied; `view` is
    /// not called.
    pub fn read<R>(&self, token: FencingToken, view: impl FnOnce(&T) -> R) -> Result<R, StaleRead> {
        let mut state = self.lock();
        if let Some(written) = state.written
            && token < written
        {
            state.refused += 1;
            return Err(StaleRead { token, written });
        }
        state.newest = state.newest.max(Some(token));
        Ok(view(&state.value))
    }

    /// Applies `update` with a writer's `token`.
    ///
    /// # Errors
    /// [`StaleToken`] when a newer token was seen, read or write; `update`
    /// is not called.
    pub fn write<R>(
        &self,
        token: FencingToken,
        update: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StaleToken> {
        let mut state = self.lock();
        if let Some(highest) = state.newest
            && token < highest
        {
            state.refused += 1;
            return Err(StaleToken { token, highest });
        }
        state.newest = Some(token);
        state.written = Some(token);
        Ok(update(&mut state.value))
    }

    /// How many reads and writes were refused.
    pub fn refused(&self) -> usize {
        self.lock().refused
    }
}

impl<T: fmt::Debug> fmt::Debug for FencedRwResource<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("FencedRwResource")
            .field("value", &state.value)
            .field("newest", &state.newest)
            .field("written", &state.written)
            .field("refused", &state.refused)
            .finish()
    }
}
