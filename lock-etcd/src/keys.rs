//! The key scheme: how lock names, queue entries, semaphores, reader-writer
//! locks and sessions map to etcd keys.
//!
//! ```text
//! <prefix><name>/<session lease, 16 hex>.<n>    a queue entry; value: a `Record`; attached to the session
//! <prefix>/permits/<name>/count                 a semaphore's agreed number of permits (no lease)
//! <prefix>/permits/<name>/slot/<i>              slot i of a semaphore, taken; value: a `Record`
//! <prefix>/rw/<name>/held/<access>/<session>.<n> a reader-writer lock's grant; value: a `Record`
//! <prefix>/rw/<name>/line/<access>/<session>.<n> a reader-writer lock's waiter (see [`rw`])
//! <prefix>/sessions/<lease, 16 hex>/alive        a session's marker, attached to it (gone with it)
//! <prefix>/sessions/<lease, 16 hex>/evicted/<r>  an eviction notice for the session's entry created at r
//! ```
//!
//! Names are escaped (`%` → `%25`, `/` → `%2F`), so they contain no `/` and
//! the mapping is injective: the queue of one name is never a sub-range of
//! another's (`a` and `a/b` stay apart). A key right after the prefix starts
//! with `/` only in the reserved part: no queue range (`<prefix><name>/` up
//! to `<prefix><name>0`, with a non-empty escaped name) contains it.
//!
//! In a queue, the entry with the smallest create revision holds the lock;
//! the others wait in create revision order. An entry is named after the
//! client's session lease and a number the client reuses once the entry is
//! gone, so a busy name keeps reusing a handful of keys (etcd keeps every
//! key ever written in its index until compaction, and a queue's range reads
//! visit them all). Every compare is on the create revision, which is new
//! for each grant, so a stale request for an earlier grant of the same key
//! never matches. (Older versions named an entry after a lease of its own:
//! `<queue><lease, 16 hex>`; both kinds share a queue.)
//!
//! What each entry's value holds is [`record`]'s; a reader-writer lock's
//! keys are [`rw`]'s.

pub(crate) mod record;
pub(crate) mod rw;

use etcd_client::{Compare, CompareOp};
use lockcore::LockName;

use rw::RwKeys;

#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: Vec<u8>,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.as_bytes().to_vec(),
        }
    }

    /// The queue of `name`: every key of this lock starts with it.
    pub(crate) fn queue(&self, name: &LockName) -> Vec<u8> {
        self.under(&self.prefix, name)
    }

    /// The entry number `n` of session `session` in `queue`.
    pub(crate) fn entry(queue: &[u8], session: i64, n: u32) -> Vec<u8> {
        let mut key = queue.to_vec();
        key.extend_from_slice(format!("{}.{n}", hex(session)).as_bytes());
        key
    }

    /// The session lease an entry of `queue` is attached to by name, if it
    /// is an entry of this version (`<session>.<n>`): where its eviction
    /// notice goes.
    pub(crate) fn entry_session(queue: &[u8], key: &[u8]) -> Option<i64> {
        let rest = std::str::from_utf8(key.strip_prefix(queue)?).ok()?;
        let (session, n) = rest.split_once('.')?;
        if session.len() != 16 || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        u64::from_str_radix(session, 16).ok().map(|id| id as i64)
    }

    /// Where a semaphore's keys live.
    pub(crate) fn semaphore(&self, name: &LockName) -> Vec<u8> {
        let mut base = self.prefix.clone();
        base.extend_from_slice(b"/permits/");
        self.under(&base, name)
    }

    /// Where a reader-writer lock's keys live.
    pub(crate) fn rw(&self, name: &LockName) -> RwKeys {
        let mut base = self.prefix.clone();
        base.extend_from_slice(b"/rw/");
        RwKeys::new(self.under(&base, name))
    }

    /// The key holding a semaphore's agreed number of permits.
    pub(crate) fn permit_count(semaphore: &[u8]) -> Vec<u8> {
        [semaphore, b"count"].concat()
    }

    /// The prefix of a semaphore's taken slots.
    pub(crate) fn slots(semaphore: &[u8]) -> Vec<u8> {
        [semaphore, b"slot/"].concat()
    }

    /// Slot `i` of the semaphore whose slots live under `slots`.
    pub(crate) fn slot(slots: &[u8], i: u32) -> Vec<u8> {
        [slots, i.to_string().as_bytes()].concat()
    }

    /// The slot number of a key under `slots`.
    pub(crate) fn slot_of(slots: &[u8], key: &[u8]) -> Option<u32> {
        std::str::from_utf8(key.strip_prefix(slots)?)
            .ok()?
            .parse()
            .ok()
    }

    /// Where one session's marker and eviction notices live.
    pub(crate) fn session(&self, session: i64) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(format!("/sessions/{}/", hex(session)).as_bytes());
        key
    }

    /// The session's marker: attached to the session lease, so its delete
    /// says the session is gone.
    pub(crate) fn alive(&self, session: i64) -> Vec<u8> {
        [self.session(session).as_slice(), b"alive"].concat()
    }

    /// The notice that the entry created at `revision` was evicted.
    pub(crate) fn notice(&self, session: i64, revision: i64) -> Vec<u8> {
        let mut key = self.session(session);
        key.extend_from_slice(format!("evicted/{revision}").as_bytes());
        key
    }

    /// The entry revision a notice key names.
    pub(crate) fn noticed(session: &[u8], key: &[u8]) -> Option<i64> {
        std::str::from_utf8(key.strip_prefix(session)?.strip_prefix(b"evicted/")?)
            .ok()?
            .parse()
            .ok()
    }

    /// The key holding the fence offset.
    pub(crate) fn fence_floor(&self) -> Vec<u8> {
        [self.prefix.as_slice(), b"/fence-floor"].concat()
    }

    /// The marker a fence floor raise to `offset` puts and deletes in
    /// `queue` (no entry of any version looks like it).
    pub(crate) fn floor_marker(queue: &[u8], offset: u64) -> Vec<u8> {
        [queue, format!("~floor.{offset}").as_bytes()].concat()
    }

    /// The offset a key of `queue` announces, if it is a floor marker.
    pub(crate) fn floor_raised(queue: &[u8], key: &[u8]) -> Option<u64> {
        std::str::from_utf8(key.strip_prefix(queue)?.strip_prefix(b"~floor.")?)
            .ok()?
            .parse()
            .ok()
    }

    /// Every key of this backend: the prefix's range.
    pub(crate) fn all(&self) -> (Vec<u8>, Vec<u8>) {
        (self.prefix.clone(), range_end(&self.prefix))
    }

    fn under(&self, base: &[u8], name: &LockName) -> Vec<u8> {
        let mut key = base.to_vec();
        key.extend_from_slice(name.escaped(|c| c == '/').as_bytes());
        key.push(b'/');
        key
    }
}

/// The end of the range of every key starting with `prefix` (etcd's
/// "prefix end": the last byte below 0xff incremented).
pub(crate) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// The compare that holds only while no key starts with `prefix`.
pub(crate) fn empty(prefix: &[u8]) -> Compare {
    // A range without keys compares as one key of create revision 0; any
    // key in it has a larger one.
    Compare::create_revision(prefix.to_vec(), CompareOp::Equal, 0).with_range(range_end(prefix))
}

/// The compares that hold only while `key` is still the entry created at
/// `revision` with `value`: a restore from a backup repeats revisions, so
/// the value (owner token, offset, label: one grant's) is compared too.
pub(crate) fn unchanged(key: &[u8], revision: i64, value: &[u8]) -> [Compare; 2] {
    [
        Compare::create_revision(key.to_vec(), CompareOp::Equal, revision),
        Compare::value(key.to_vec(), CompareOp::Equal, value.to_vec()),
    ]
}

/// 16 hex digits (two's complement bits: injective for every i64).
fn hex(id: i64) -> String {
    format!("{:016x}", id as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> LockName {
        LockName::new(s).unwrap()
    }

    fn inside(key: &[u8], prefix: &[u8]) -> bool {
        key >= prefix && key < range_end(prefix).as_slice()
    }

    #[test]
    fn queues_never_contain_each_other_or_the_reserved_keys() {
        for prefix in ["p/", "p", "distlock/"] {
            let keys = Keys::new(prefix);
            let names = [
                "a", "a/b", "a%2Fb", "a%b", "a/", "%", "/", "a0", "a.", "b", "permits",
            ];
            let reserved = [
                Keys::slot(&Keys::slots(&keys.semaphore(&name("a"))), 3),
                Keys::permit_count(&keys.semaphore(&name("a"))),
                keys.notice(7, 42),
                keys.alive(7),
                keys.fence_floor(),
                Keys::entry(&keys.rw(&name("a")).held_by(lockcore::Access::Write), 7, 0),
                Keys::entry(
                    &keys.rw(&name("a")).waiting_for(lockcore::Access::Read),
                    7,
                    0,
                ),
            ];
            for x in names {
                let qx = keys.queue(&name(x));
                for y in names {
                    let entry = Keys::entry(&keys.queue(&name(y)), 0x7fff_0000_1234, 3);
                    assert_eq!(inside(&keys.queue(&name(y)), &qx), x == y, "{x:?} vs {y:?}");
                    assert_eq!(inside(&entry, &qx), x == y, "entry of {y:?} in {x:?}");
                    let sx = keys.semaphore(&name(x));
                    let slot = Keys::slot(&Keys::slots(&keys.semaphore(&name(y))), 1);
                    assert_eq!(inside(&slot, &sx), x == y, "slot of {y:?} in {x:?}");
                    let (rx, ry) = (keys.rw(&name(x)), keys.rw(&name(y)));
                    let waiter = Keys::entry(&ry.waiting_for(lockcore::Access::Write), 1, 0);
                    assert_eq!(
                        inside(&waiter, rx.base()),
                        x == y,
                        "waiter of {y:?} in {x:?}"
                    );
                    assert!(!inside(&waiter, &rx.held()), "a waiter among grants");
                }
                for key in &reserved {
                    assert!(!inside(key, &qx), "{key:?} in the queue of {x:?}");
                }
            }
        }
    }

    #[test]
    fn keys_are_readable_and_parse_back() {
        let keys = Keys::new("distlock/");
        let queue = keys.queue(&name("jobs/nightly 100%"));
        assert_eq!(queue, b"distlock/jobs%2Fnightly 100%25/");
        let entry = Keys::entry(&queue, 0x2a, 3);
        assert_eq!(entry, b"distlock/jobs%2Fnightly 100%25/000000000000002a.3");
        assert_eq!(Keys::entry_session(&queue, &entry), Some(0x2a));
        let old_style = [queue.as_slice(), b"000000000000002a"].concat();
        assert_eq!(Keys::entry_session(&queue, &old_style), None);
        assert_eq!(
            Keys::entry_session(&queue, &Keys::entry(&queue, -1, 0)),
            Some(-1)
        );
        assert_eq!(range_end(b"a/"), b"a0");
        assert_eq!(range_end(b"a\xff"), b"b");
    }
}
