//! What a lock entry or permit slot holds: its owner token, the fence
//! offset in force when it was written, and the holder's label, one per
//! line (labels have no control characters):
//!
//! ```text
//! 0f3c…e1 (owner token, 32 hex)
//! 0       (fence offset: the grant's fence is this + its create revision)
//! billing-7f9c:4121
//! ```
//!
//! Older versions wrote the owner token alone: offset 0, no label.

use lockcore::{FencingToken, Holder, HolderLabel, LockError, OwnerToken};

use crate::error::BACKEND;

/// One grant's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) owner: OwnerToken,
    pub(crate) offset: u64,
    pub(crate) label: Option<HolderLabel>,
}

impl Record {
    pub(crate) fn new(owner: OwnerToken, offset: u64, label: &HolderLabel) -> Self {
        Record {
            owner,
            offset,
            label: Some(label.clone()),
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let label = self.label.as_ref().map_or("", HolderLabel::as_str);
        format!("{}\n{}\n{label}", self.owner.encode(), self.offset).into_bytes()
    }

    /// What `value` says; `None` for a value no version of this backend
    /// wrote (an operator's key in the queue).
    pub(crate) fn decode(value: &[u8]) -> Option<Record> {
        let text = std::str::from_utf8(value).ok()?;
        let mut lines = text.splitn(3, '\n');
        let owner = OwnerToken::decode(lines.next()?)?;
        let offset = match lines.next() {
            None => 0,
            Some(offset) => offset.parse().ok()?,
        };
        let label = lines.next().and_then(|l| HolderLabel::new(l).ok());
        Some(Record {
            owner,
            offset,
            label,
        })
    }

    /// The fence of the grant this record belongs to, created at `revision`.
    pub(crate) fn fence(offset: u64, revision: i64) -> Result<FencingToken, LockError> {
        let revision = FencingToken::from_store(BACKEND, revision)?;
        revision
            .get()
            .checked_add(offset)
            .and_then(FencingToken::new)
            .ok_or_else(|| LockError::store(BACKEND, "fence offset overflows"))
    }

    /// The holder of an entry created at `revision` with this `value`.
    pub(crate) fn holder(
        value: &[u8],
        revision: i64,
        expires_in: Option<std::time::Duration>,
    ) -> Result<Holder, LockError> {
        let record = Record::decode(value);
        let offset = record.as_ref().map_or(0, |r| r.offset);
        let fence = Record::fence(offset, revision)?;
        let (owner, label) = record.map_or((None, None), |r| (Some(r.owner), r.label));
        Ok(Holder::new(fence, owner, expires_in).with_label(label))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_older_values() {
        let label = HolderLabel::new("worker 3 «billing» ; : %").unwrap();
        let record = Record::new(OwnerToken::new(), 1_000_000, &label);
        assert_eq!(Record::decode(&record.encode()), Some(record.clone()));
        let older = record.owner.encode();
        assert_eq!(
            Record::decode(older.as_bytes()),
            Some(Record {
                owner: record.owner,
                offset: 0,
                label: None
            })
        );
        assert_eq!(Record::decode(b"not a token"), None);
        let holder = Record::holder(&record.encode(), 7, None).unwrap();
        assert_eq!(holder.fence.get(), 1_000_007);
        assert_eq!(holder.label, Some(label));
        assert_eq!(Record::holder(b"junk", 7, None).unwrap().owner, None);
        assert!(Record::fence(u64::MAX, 2).is_err());
    }
}
