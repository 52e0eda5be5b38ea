//! The paths of the backend's nodes under the lock root (the README's
//! "Nodes"): a lock's queue, the semaphores, the reader-writer locks, the
//! fence floor, and the probe connect creates. The backend's own nodes are
//! named with a bare `%` followed by no hex pair, which starts no
//! percent-escape, so no lock name's segment is one of them.

use lockcore::LockName;

use super::names::segment;

/// The fence floor's node: its offset, once raised.
pub(crate) fn floor(root: &str) -> String {
    format!("{root}/%floor")
}

/// The node that holds every semaphore.
pub(crate) fn semaphores(root: &str) -> String {
    format!("{root}/%permits")
}

/// Lock `name`'s queue: one child of the root.
pub(crate) fn lock(root: &str, name: &LockName) -> String {
    format!("{root}/{}", segment(name))
}

/// Semaphore `name`: its count, and its slots' queues as children.
pub(crate) fn semaphore(root: &str, name: &LockName) -> String {
    format!("{}/{}", semaphores(root), segment(name))
}

/// The node that holds every reader-writer lock.
pub(crate) fn rw_locks(root: &str) -> String {
    format!("{root}/%rw")
}

/// Reader-writer lock `name`'s queue of read and write nodes.
pub(crate) fn rw_lock(root: &str, name: &LockName) -> String {
    format!("{}/{}", rw_locks(root), segment(name))
}

/// A node connect creates and deletes at once, to learn whether this
/// client may queue under the root.
pub(crate) fn probe(root: &str) -> String {
    format!("{root}/%probe-{}", uuid::Uuid::new_v4().simple())
}
