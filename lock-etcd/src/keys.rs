//! The key scheme: one queue per lock name, one entry per acquisition.
//!
//! ```text
//! <prefix><escaped name>/<lease id, 16 hex digits>   value: owner token; attached to that lease
//! ```
//!
//! The name is escaped (`%` → `%25`, `/` → `%2F`), so it contains no `/` and
//! the mapping is injective: the queue of one name is never a sub-range of
//! another's, whatever the names (`a` and `a/b` stay apart). The entry with
//! the smallest create revision holds the lock; the others wait in create
//! revision order. The fencing token is the holder's create revision.
//!
//! An entry is named after its lease, not its acquisition: a lease carries
//! at most one lock at a time, and leases are reused, so a busy name keeps
//! reusing a handful of keys. (etcd keeps every key ever written in its index
//! until compaction, and the queue's range reads visit them all: one fresh
//! key per acquisition made a hot name slower with every cycle.) Every
//! compare is on the create revision, which is new for each grant, so a
//! stale request for an earlier grant of the same key never matches.

use lockcore::LockName;

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
        let mut key = self.prefix.clone();
        key.extend_from_slice(name.escaped(|c| c == '/').as_bytes());
        key.push(b'/');
        key
    }

    /// The end of the queue's range: the queue with its final `/` bumped to `0`.
    pub(crate) fn queue_end(queue: &[u8]) -> Vec<u8> {
        let mut end = queue.to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1; // '/' + 1 == '0'; a queue always ends with '/'
        }
        end
    }

    /// The entry attached to lease `lease_id`. Lease ids are unique in the
    /// cluster and this client holds the lease, so only it writes this key.
    pub(crate) fn entry(&self, name: &LockName, lease_id: i64) -> Vec<u8> {
        let mut key = self.queue(name);
        // Two's complement bits: injective for every i64.
        key.extend_from_slice(format!("{:016x}", lease_id as u64).as_bytes());
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> LockName {
        LockName::new(s).unwrap()
    }

    #[test]
    fn queues_never_contain_each_other() {
        let keys = Keys::new("p/");
        let names = ["a", "a/b", "a%2Fb", "a%b", "a/", "%", "/", "a0", "a.", "b"];
        for x in names {
            let qx = keys.queue(&name(x));
            let end = Keys::queue_end(&qx);
            for y in names {
                let qy = keys.queue(&name(y));
                let inside = qy.as_slice() >= qx.as_slice() && qy.as_slice() < end.as_slice();
                assert_eq!(inside, x == y, "{x:?} vs {y:?}");
                let entry = keys.entry(&name(y), 0x7fff_0000_1234);
                let inside = entry.as_slice() >= qx.as_slice() && entry.as_slice() < end.as_slice();
                assert_eq!(inside, x == y, "entry of {y:?} in queue of {x:?}");
            }
        }
    }

    #[test]
    fn escaping_is_readable() {
        let keys = Keys::new("distlock/");
        assert_eq!(
            keys.queue(&name("jobs/nightly 100%")),
            b"distlock/jobs%2Fnightly 100%25/"
        );
        assert_eq!(keys.entry(&name("a"), 0x2a), b"distlock/a/000000000000002a");
    }
}
