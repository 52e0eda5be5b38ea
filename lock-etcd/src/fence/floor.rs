//! The fence offset as this client last saw it (see `fence` for the
//! floor): compared in every write of a new lock entry or permit, recorded
//! in it, learned from the reads that come back when the compare fails.

use std::sync::Mutex;

use etcd_client::{Compare, CompareOp, KeyValue, TxnOp, TxnOpResponse, TxnResponse};
use lockcore::LockError;

use crate::error::protocol;
use crate::keys::Keys;

/// The fence offset as this client last saw it.
#[derive(Debug)]
pub(crate) struct Floor {
    key: Vec<u8>,
    /// The key's value (`None`: absent).
    known: Mutex<Option<Vec<u8>>>,
}

impl Floor {
    pub(crate) fn new(keys: &Keys) -> Self {
        Floor {
            key: keys.fence_floor(),
            known: Mutex::new(None),
        }
    }

    /// Its key.
    pub(crate) fn key(&self) -> Vec<u8> {
        self.key.clone()
    }

    fn known(&self) -> Option<Vec<u8>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The offset this client knows (a new entry records the one
    /// [`guard`](Self::guard) compares, read with it).
    pub(crate) fn offset(&self) -> u64 {
        self.known().map_or(0, |v| parse(&v).unwrap_or(0))
    }

    /// One reading of what this client knows: the compare that holds while
    /// the offset is still that, and that offset. A `Txn` records the offset
    /// it compares, never one read a moment apart (a raise learned in
    /// between would let an entry under the old offset pass the new floor).
    pub(crate) fn guard(&self) -> (Compare, u64) {
        match self.known() {
            Some(value) => {
                let offset = parse(&value).unwrap_or(0);
                (
                    Compare::value(self.key.clone(), CompareOp::Equal, value),
                    offset,
                )
            }
            None => (Compare::version(self.key.clone(), CompareOp::Equal, 0), 0),
        }
    }

    /// After a `Txn` guarded at `offset` failed: learns the floor from its
    /// reply, and whether the floor is no longer `offset` (taught by this
    /// reply or, meanwhile, by another read: either way the guard failed
    /// because of it, or may have).
    pub(crate) fn moved_since(&self, reply: &TxnResponse, offset: u64) -> Result<bool, LockError> {
        self.learn_from(reply)?;
        Ok(self.offset() != offset)
    }

    /// Reads the offset (in a `Txn`'s failure branch).
    pub(crate) fn get(&self) -> TxnOp {
        TxnOp::get(self.key.clone(), None)
    }

    /// Learns the offset from a read of its key (the read's kvs); `true` if
    /// it changed.
    pub(crate) fn learn(&self, kvs: &[KeyValue]) -> Result<bool, LockError> {
        let seen = kvs
            .iter()
            .find(|kv| kv.key() == self.key)
            .map(|kv| kv.value().to_vec());
        self.learn_value(seen)
    }

    /// Learns the offset from its key's value (`None`: absent); `true` if
    /// it changed.
    pub(crate) fn learn_value(&self, seen: Option<Vec<u8>>) -> Result<bool, LockError> {
        if let Some(value) = &seen {
            parse(value).ok_or_else(|| {
                protocol(format!(
                    "the fence floor holds {:?}",
                    String::from_utf8_lossy(value)
                ))
            })?;
        }
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let changed = *known != seen;
        *known = seen;
        Ok(changed)
    }

    /// Learns the offset from a `Txn` reply whose last operation is
    /// [`get`](Self::get).
    pub(crate) fn learn_from(&self, reply: &TxnResponse) -> Result<bool, LockError> {
        let last = reply
            .op_responses()
            .into_iter()
            .rev()
            .find_map(|r| match r {
                TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
                _ => None,
            });
        match last {
            Some(kvs) => self.learn(&kvs),
            None => Err(protocol("a reply without the fence floor")),
        }
    }

    /// A raise to `offset` was seen (a queue's marker): learn it if higher.
    pub(crate) fn raised(&self, offset: u64) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.as_deref().and_then(parse).is_none_or(|o| o < offset) {
            *known = Some(offset.to_string().into_bytes());
        }
    }
}

pub(crate) fn parse(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}
