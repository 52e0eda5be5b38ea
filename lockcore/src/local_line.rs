//! `LocalLine`: one waiter per name per backend instance waits on the store.
//!
//! When 2,000 tasks of one process wait for the same lock, only one of them
//! needs to talk to the store: the others can wait their turn in the
//! process. Without that, every release wakes them all (a herd) and each
//! sends its own attempt. A backend takes a [`LocalTurn`] before its store
//! wait and drops it once the wait ends (granted, timed out or cancelled):
//! waiters of one name then go to the store one at a time, in arrival order
//! (tokio's mutex is fair), and the next starts the moment the previous
//! one's wait ends.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::LockName;

type Turns = Arc<Mutex<HashMap<LockName, Arc<tokio::sync::Mutex<()>>>>>;

/// The local line of every name one backend instance waits on.
#[derive(Default, Clone)]
pub struct LocalLine {
    turns: Turns,
}

/// Being first in the local line of one name. Dropping it lets the next
/// local waiter go.
pub struct LocalTurn {
    turns: Turns,
    name: LockName,
    turn: Option<OwnedMutexGuard<()>>,
}

impl LocalLine {
    /// An empty line.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits until every earlier local waiter of `name` is done waiting.
    /// Cancel safe: dropping the future leaves the line.
    pub async fn turn(&self, name: &LockName) -> LocalTurn {
        let turn = {
            let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
            turns.entry(name.clone()).or_default().clone()
        };
        let mut guard = Forget {
            turns: self.turns.clone(),
            name: name.clone(),
            armed: true,
        };
        let held = turn.lock_owned().await;
        guard.armed = false;
        LocalTurn {
            turns: self.turns.clone(),
            name: name.clone(),
            turn: Some(held),
        }
    }

    /// How many names have local waiters.
    pub fn names(&self) -> usize {
        self.turns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Forgets `name`'s entry once nobody holds or waits for it.
fn forget_if_unused(turns: &Turns, name: &LockName) {
    let mut turns = turns.lock().unwrap_or_else(|p| p.into_inner());
    if turns.get(name).is_some_and(|t| Arc::strong_count(t) == 1) {
        turns.remove(name);
    }
}

/// Tidies the map when a `turn` future is dropped while waiting.
struct Forget {
    turns: Turns,
    name: LockName,
    armed: bool,
}

impl Drop for Forget {
    fn drop(&mut self) {
        if self.armed {
            forget_if_unused(&self.turns, &self.name);
        }
    }
}

impl Drop for LocalTurn {
    fn drop(&mut self) {
        drop(self.turn.take());
        forget_if_unused(&self.turns, &self.name);
    }
}

impl fmt::Debug for LocalLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalLine")
            .field("names", &self.names())
            .finish()
    }
}

impl fmt::Debug for LocalTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalTurn")
            .field("name", &self.name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_waiter_per_name_in_arrival_order_and_nothing_left_behind() {
        let line = LocalLine::new();
        let (a, b) = (LockName::new("a").unwrap(), LockName::new("b").unwrap());
        let first = line.turn(&a).await;
        let other_name = line.turn(&b).await; // another name never waits
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (line, a, order) = (line.clone(), a.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = line.turn(&a).await;
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // A cancelled waiter leaves the line.
        let cancelled = tokio::time::timeout(Duration::from_millis(5), line.turn(&a)).await;
        assert!(cancelled.is_err());
        assert!(order.lock().unwrap().is_empty(), "nobody passed the first");
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        drop(other_name);
        assert_eq!(line.names(), 0, "no entry outlives its waiters");
    }
}
