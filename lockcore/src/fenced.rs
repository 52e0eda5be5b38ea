//! `FencedResource`: an in-memory resource that checks fencing tokens, the
//! model of what every protected resource must do.

use std::fmt;
use std::sync::Mutex;

use crate::FencingToken;

/// A value guarded by fencing: a write is applied only if its token is not
/// older than the newest token already applied.
///
/// Equal tokens are accepted because one holder writes several times under
/// the same grant; tokens are unique per grant, so equal means "same holder".
///
/// ```
/// use lockcore::{FencedResource, FencingToken};
///
/// let stock = FencedResource::new(1_u32);
/// let (old, new) = (FencingToken::new(7).unwrap(), FencingToken::new(8).unwrap());
/// stock.write(new, |units| *units -= 1).unwrap();
/// assert!(stock.write(old, |units| *units -= 1).is_err()); // the zombie is fenced out
/// assert_eq!(stock.read(), 0);
/// ```
pub struct FencedResource<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    value: T,
    highest: Option<FencingToken>,
    accepted: Vec<FencingToken>,
    rejected: usize,
}

/// The outcome of a fenced write anywhere in distlock (this model, and the
/// adapters' resource-side helpers): the write's result, or [`StaleToken`]
/// when a newer holder already wrote.
pub type Fenced<T> = Result<T, StaleToken>;

/// A write refused because a newer token was already applied: the one
/// refusal of every fenced write in distlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {token}: the resource has already accepted {highest}")]
pub struct StaleToken {
    /// The token of the refused write.
    pub token: FencingToken,
    /// The newest token the resource had accepted.
    pub highest: FencingToken,
}

impl<T> FencedResource<T> {
    /// A resource holding `value`, no token seen yet.
    pub fn new(value: T) -> Self {
        FencedResource {
            state: Mutex::new(State {
                value,
                highest: None,
                accepted: Vec::new(),
                rejected: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `update` if `token` is not older than every token applied so
    /// far, and returns what `update` returned.
    ///
    /// # Errors
    /// [`StaleToken`] when a newer token was applied; `update` is not called.
    pub fn write<R>(
        &self,
        token: FencingToken,
        update: impl FnOnce(&mut T) -> R,
    ) -> Result<R, StaleToken> {
        let mut state = self.lock();
        if let Some(highest) = state.highest
            && token < highest
        {
            state.rejected += 1;
            return Err(StaleToken { token, highest });
        }
        state.highest = Some(token);
        state.accepted.push(token);
        Ok(update(&mut state.value))
    }

    /// The tokens of applied writes, in the order they were applied.
    pub fn accepted(&self) -> Vec<FencingToken> {
        self.lock().accepted.clone()
    }

    /// How many writes were refused.
    pub fn rejected(&self) -> usize {
        self.lock().rejected
    }
}

impl<T: Clone> FencedResource<T> {
    /// A copy of the current value.
    pub fn read(&self) -> T {
        self.lock().value.clone()
    }
}

impl<T: fmt::Debug> fmt::Debug for FencedResource<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("FencedResource")
            .field("value", &state.value)
            .field("highest", &state.highest)
            .field("rejected", &state.rejected)
            .finish()
    }
}

/// A resource shared by a semaphore's holders, fenced per slot: a write is
/// applied only if its token is not older than the newest token applied
/// *through the same slot*. A paused permit holder whose slot was granted
/// again is refused once the new holder of that slot has written, like a
/// stale lock holder; holders of other slots are not affected.
///
/// ```
/// use lockcore::{FencedSlots, FencingToken};
///
/// let parts = FencedSlots::new(vec![0_u32; 2]);
/// let (old, new) = (FencingToken::new(3).unwrap(), FencingToken::new(9).unwrap());
/// parts.write(1, new, |n| *n += 1).unwrap();
/// assert!(parts.write(1, old, |n| *n += 1).is_err()); // slot 1 was granted again
/// assert!(parts.write(0, old, |n| *n += 1).is_ok()); // slot 0 is another story
/// ```
#[derive(Debug)]
pub struct FencedSlots<T> {
    slots: Vec<FencedResource<T>>,
}

impl<T> FencedSlots<T> {
    /// One fenced value per slot, slot `i` starting at `values[i]`.
    pub fn new(values: Vec<T>) -> Self {
        FencedSlots {
            slots: values.into_iter().map(FencedResource::new).collect(),
        }
    }

    /// How many slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Applies `update` to slot `slot` if `token` is not older than every
    /// token applied through that slot.
    ///
    /// # Errors
    /// [`StaleToken`] when a newer token was applied through `slot`.
    ///
    /// # Panics
    /// When `slot` is not below [`len`](Self::len).
    pub fn write<R>(
        &self,
        slot: u32,
        token: FencingToken,
        update: impl FnOnce(&mut T) -> R,
    ) -> Fenced<R> {
        self.slots[slot as usize].write(token, update)
    }

    /// The fenced value of one slot.
    ///
    /// # Panics
    /// When `slot` is not below [`len`](Self::len).
    pub fn slot(&self, slot: u32) -> &FencedResource<T> {
        &self.slots[slot as usize]
    }
}
