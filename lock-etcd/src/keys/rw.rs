//! Where a reader-writer lock lives: under `<prefix>/rw/<name>/`, apart
//! from the lock's queue and the semaphore of that name. Its grants are
//! under `held/`, its waiters under `line/`, each under the access it holds
//! or asks for, named like a lock's entries (`<session>.<n>`) and attached
//! to the session of the client that wrote them:
//!
//! ```text
//! <rw>held/read/<session>.<n>     a reader's grant; value: a `Record` (fence: create revision + offset)
//! <rw>held/write/<session>.<n>    the writer's grant
//! <rw>line/read/<session>.<n>     a reader waiting, in create revision order
//! <rw>line/write/<session>.<n>    a writer waiting: its intent, which keeps new readers out
//! ```
//!
//! A grant is a new key, written by the transaction that decides it, so its
//! create revision is that transaction's: fences grow in grant order, reads
//! and writes alike (see `rw`).

use lockcore::Access;

/// The keys of one reader-writer lock.
#[derive(Debug, Clone)]
pub(crate) struct RwKeys {
    base: Vec<u8>,
}

impl RwKeys {
    /// The keys under `base` (`<prefix>/rw/<escaped name>/`).
    pub(crate) fn new(base: Vec<u8>) -> Self {
        RwKeys { base }
    }

    /// Every key of this lock starts with it.
    pub(crate) fn base(&self) -> &[u8] {
        &self.base
    }

    /// The prefix of every grant.
    pub(crate) fn held(&self) -> Vec<u8> {
        [self.base.as_slice(), b"held/"].concat()
    }

    /// The prefix of every waiter.
    pub(crate) fn line(&self) -> Vec<u8> {
        [self.base.as_slice(), b"line/"].concat()
    }

    /// The prefix of the grants of `access`.
    pub(crate) fn held_by(&self, access: Access) -> Vec<u8> {
        Self::of(self.held(), access)
    }

    /// The prefix of the waiters for `access`.
    pub(crate) fn waiting_for(&self, access: Access) -> Vec<u8> {
        Self::of(self.line(), access)
    }

    /// The access a grant's key holds (`None`: no grant key of this lock).
    pub(crate) fn held_access(&self, key: &[u8]) -> Option<Access> {
        let rest = key.strip_prefix(self.held().as_slice())?;
        let (access, _) = std::str::from_utf8(rest).ok()?.split_once('/')?;
        Access::parse(access)
    }

    fn of(mut prefix: Vec<u8>, access: Access) -> Vec<u8> {
        prefix.extend_from_slice(access.as_str().as_bytes());
        prefix.push(b'/');
        prefix
    }
}
