//! What a client granted and still answers for: every lease it handed out
//! that may still count, with its loss signal, and whether the client is
//! closed. One lock over both, so a grant that commits while the client
//! closes either is drained by `close` or sees the client closed and fires
//! its own loss: no lease of a closed client ever reads "held".

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use lockcore::backend::CancellationToken;
use lockcore::{Lease, LockName, OwnerToken};

use crate::keys::Kind;

/// One grant of this client, by fence (unique per grant).
#[derive(Debug)]
pub(crate) struct Held {
    /// Its presence file, kept in `presence::KEPT` (`None`: it has none).
    pub(crate) path: Option<PathBuf>,
    pub(crate) kind: Kind,
    pub(crate) name: LockName,
    pub(crate) slot: Option<u32>,
    pub(crate) owner: OwnerToken,
    pub(crate) lost: CancellationToken,
    /// Our inotify watch of its presence file.
    pub(crate) watch: Option<i32>,
    /// The row's expiry as last written (boot-clock nanoseconds).
    pub(crate) until: i64,
}

impl Held {
    /// Whether `lease` is this grant (not a forgery with its fence).
    pub(crate) fn is(&self, lease: &Lease) -> bool {
        lease.owner() == self.owner
            && lease.name() == &self.name
            && lease.slot() == self.slot
            && Kind::of(lease) == self.kind
    }

    /// The `slot` column of its row, granted under `fence`.
    pub(crate) fn row_slot(&self, fence: u64) -> i64 {
        self.kind.row_slot(self.slot, fence)
    }
}

/// Why a client refuses work.
#[derive(Debug, Clone)]
pub(crate) enum Closed {
    /// `close` was called.
    ByCall,
    /// Its lock file was replaced under it (what changed, in words).
    Replaced(String),
}

#[derive(Debug, Default)]
struct State {
    closed: Option<Closed>,
    grants: HashMap<u64, Held>,
}

/// The grants of one client, and whether it is closed.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    state: Mutex<State>,
}

impl Grants {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the client is closed, if it is.
    pub(crate) fn closed(&self) -> Option<Closed> {
        self.lock().closed.clone()
    }

    /// Records a grant made under `fence`. `Err(held)` when the client was
    /// closed meanwhile: the caller fires its loss and lets it go.
    pub(crate) fn insert(&self, fence: u64, held: Held) -> Result<(), Held> {
        let mut state = self.lock();
        if state.closed.is_some() {
            return Err(held);
        }
        state.grants.insert(fence, held);
        Ok(())
    }

    /// Removes grant `fence` if it is `lease`'s (any grant when `None`).
    pub(crate) fn remove(&self, fence: u64, lease: Option<&Lease>) -> Option<Held> {
        let mut state = self.lock();
        match state.grants.get(&fence) {
            Some(held) if lease.is_none_or(|l| held.is(l)) => state.grants.remove(&fence),
            _ => None,
        }
    }

    /// The owner of grant `fence`, if it is ours.
    pub(crate) fn owner(&self, fence: u64) -> Option<OwnerToken> {
        self.lock().grants.get(&fence).map(|h| h.owner)
    }

    /// Fires the loss of grant `fence`, if it is ours.
    pub(crate) fn lose(&self, fence: u64) {
        if let Some(held) = self.lock().grants.get(&fence) {
            held.lost.cancel();
        }
    }

    /// Moves grant `fence`'s expiry forward to `until` (a renewal wrote it).
    pub(crate) fn extend(&self, fence: u64, until: i64) {
        if let Some(held) = self.lock().grants.get_mut(&fence) {
            held.until = held.until.max(until);
        }
    }

    /// Removes the grants whose rows expired by `now`: they no longer count,
    /// and their leases passed their local deadlines before.
    pub(crate) fn expired(&self, now: i64) -> Vec<(u64, Held)> {
        let mut state = self.lock();
        let gone: Vec<u64> = (state.grants.iter())
            .filter(|(_, held)| held.until <= now)
            .map(|(&fence, _)| fence)
            .collect();
        gone.into_iter()
            .filter_map(|fence| Some((fence, state.grants.remove(&fence)?)))
            .collect()
    }

    /// Closes the client (the first reason stays) and hands back every
    /// grant, each one's loss fired: nothing it granted reads "held" from
    /// here on, and every later call is refused.
    pub(crate) fn close(&self, why: Closed) -> Vec<(u64, Held)> {
        let mut state = self.lock();
        state.closed.get_or_insert(why);
        let grants: Vec<(u64, Held)> = state.grants.drain().collect();
        for (_, held) in &grants {
            held.lost.cancel();
        }
        grants
    }
}
