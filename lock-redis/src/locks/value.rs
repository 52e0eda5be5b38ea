//! What a lock key or a semaphore slot holds, `"<owner>:<fence> <label>"`,
//! read and written the same way for locks and permits; and the remaining
//! times the scripts answer.

use std::time::Duration;

use lockcore::{FencingToken, Holder, HolderLabel, Lease, LockError, OwnerToken};

use crate::error;

/// `"<owner>:<fence>"`: what identifies `lease` in the store (the stored
/// value adds `" <label>"`).
pub(crate) fn lease_value(lease: &Lease) -> String {
    format!("{}:{}", lease.owner().encode(), lease.fence())
}

/// What a lock key or a semaphore slot holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Stored {
    owner: OwnerToken,
    fence: FencingToken,
    /// `None` for values written before labels were stored.
    label: Option<HolderLabel>,
}

impl Stored {
    pub(crate) fn holder(self, expires_in: Option<Duration>) -> Holder {
        Holder::new(self.fence, Some(self.owner), expires_in).with_label(self.label)
    }
}

/// Parses `"<owner>:<fence>"`, optionally followed by `" <label>"`.
pub(crate) fn parse_value(key: &str, value: &str) -> Result<Stored, LockError> {
    let (lease, label) = match value.split_once(' ') {
        Some((lease, label)) => (lease, HolderLabel::new(label).ok()),
        None => (value, None),
    };
    lease
        .split_once(':')
        .and_then(|(owner, fence)| {
            Some(Stored {
                owner: OwnerToken::decode(owner)?,
                fence: FencingToken::new(fence.parse().ok()?)?,
                label,
            })
        })
        .ok_or_else(|| {
            error::unexpected(format!(
                "{key} holds a value distlock did not write ({} bytes)",
                value.len()
            ))
        })
}

/// A remaining time in ms from the server; negative means none.
pub(crate) fn remaining(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use lockcore::LockName;
    use lockcore::backend::Moment;

    use super::*;

    #[test]
    fn values_round_trip_and_foreign_values_are_errors() {
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(1_795_940_012_062_115).unwrap(),
            lockcore::Capabilities::new("test")
                .effective_ttl(Duration::from_secs(1))
                .unwrap(),
            Moment::now(),
        );
        let value = lease_value(&lease);
        let unlabelled = parse_value("k", &value).unwrap();
        assert_eq!(
            (unlabelled.owner, unlabelled.fence),
            (lease.owner(), lease.fence())
        );
        assert_eq!(
            unlabelled.label, None,
            "values of older versions have no label"
        );
        let labelled = parse_value("k", &format!("{value} worker 3: a:b")).unwrap();
        assert_eq!(
            labelled.label,
            Some(HolderLabel::new("worker 3: a:b").unwrap())
        );
        for bad in [
            "",
            "x",
            "abc:1",
            &format!("{}:0", lease.owner().encode()),
            &format!("{}:-1", lease.owner().encode()),
        ] {
            assert!(
                matches!(parse_value("k", bad), Err(LockError::Store { .. })),
                "{bad}"
            );
        }
        assert_eq!(remaining(-2), None);
        assert_eq!(remaining(-1), None);
        assert_eq!(remaining(1500), Some(Duration::from_millis(1500)));
    }
}
