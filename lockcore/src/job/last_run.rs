//! The record of a job's last completed run, kept for `once_per`: a lock
//! on the job's record name, left to the store to expire when the run's
//! window ends, whose holder label says which run it was.

use std::time::{Duration, SystemTime};

use crate::{FencingToken, Holder, HolderLabel, LockError, LockName};

/// What is appended to a job's name to name its record.
pub(crate) const SUFFIX: &str = "#last-run";

/// The name a job's record of its last completed run is kept under:
/// `NAME#last-run`.
///
/// # Errors
/// [`LockError::InvalidConfig`] when the job's name leaves no room for the
/// suffix (255 bytes at most in all).
pub(crate) fn record_name(job: &LockName) -> Result<LockName, LockError> {
    let name = format!("{job}{SUFFIX}");
    if name.len() > LockName::MAX_BYTES {
        return Err(LockError::config(format!(
            "job \"{job}\": with once_per its last run is kept under \"{job}{SUFFIX}\", \
             which is longer than {} bytes: use a shorter name",
            LockName::MAX_BYTES
        )));
    }
    LockName::new(name)
}

/// A job's last completed run, as its record says (see
/// [`Job::once_per`](crate::Job::once_per)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LastRun {
    /// The run's execution id: its grant's fencing token.
    pub fence: FencingToken,
    /// How long it held the name, from asking for it to its end.
    pub took: Duration,
    /// When it ended, on the clock of the node that ran it: for people to
    /// read; nothing is decided on it (the window is the store's).
    pub ended_at: SystemTime,
    /// The label of the node that ran it (its locker's label).
    pub by: String,
    /// Time left in its window, as the store counts it: no run starts
    /// before then.
    pub window_left: Option<Duration>,
}

impl LastRun {
    /// The record of a run by `by` with fence `fence` that took `took` and
    /// ended at `ended_at`, as a holder label:
    /// `fence=12 took_ms=3400 ended_ms=1765012345678 by=host:42` (`by` cut
    /// to fit; `ended_ms` in milliseconds since the Unix epoch).
    pub(crate) fn label(
        fence: FencingToken,
        took: Duration,
        ended_at: SystemTime,
        by: &HolderLabel,
    ) -> HolderLabel {
        let ended = ended_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let head = format!(
            "fence={fence} took_ms={} ended_ms={} by=",
            took.as_millis(),
            ended.as_millis()
        );
        let room = HolderLabel::MAX_BYTES - head.len();
        let by = by.as_str();
        let mut cut = by.len().min(room);
        while !by.is_char_boundary(cut) {
            cut -= 1;
        }
        let by = &by[..cut];
        HolderLabel::new(format!("{head}{by}")).expect("digits, ASCII and a valid label's prefix")
    }

    /// The run a record's holder describes; `None` when its label is not
    /// a record's (someone else holds the record name).
    pub fn from_holder(holder: &Holder) -> Option<LastRun> {
        let label = holder.label.as_ref()?.as_str();
        let rest = label.strip_prefix("fence=")?;
        let (fence, rest) = rest.split_once(" took_ms=")?;
        let (took, rest) = rest.split_once(" ended_ms=")?;
        let (ended, by) = rest.split_once(" by=")?;
        Some(LastRun {
            fence: FencingToken::new(fence.parse().ok()?)?,
            took: Duration::from_millis(took.parse().ok()?),
            ended_at: SystemTime::UNIX_EPOCH + Duration::from_millis(ended.parse().ok()?),
            by: by.to_owned(),
            window_left: holder.expires_in,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OwnerToken;

    fn holder(label: &str) -> Holder {
        Holder {
            fence: FencingToken::new(99).unwrap(),
            owner: Some(OwnerToken::new()),
            expires_in: Some(Duration::from_secs(7)),
            label: Some(HolderLabel::new(label).unwrap()),
            slot: None,
            access: None,
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_a_long_label_is_cut_to_fit() {
        let fence = FencingToken::new(u64::MAX).unwrap();
        let long = HolderLabel::new("é".repeat(64)).unwrap();
        for by in [HolderLabel::new("node-a:42").unwrap(), long] {
            let ended = SystemTime::UNIX_EPOCH + Duration::from_millis(1_765_012_345_678);
            let label = LastRun::label(fence, Duration::from_millis(3400), ended, &by);
            assert!(label.as_str().len() <= HolderLabel::MAX_BYTES);
            let read = LastRun::from_holder(&holder(label.as_str())).unwrap();
            assert_eq!(read.fence, fence);
            assert_eq!(read.took, Duration::from_millis(3400));
            assert_eq!(read.ended_at, ended);
            assert!(by.as_str().starts_with(&read.by) && !read.by.is_empty());
            assert_eq!(read.window_left, Some(Duration::from_secs(7)));
        }
    }

    #[test]
    fn a_label_that_is_not_a_record_is_none() {
        for label in [
            "host:1",
            "fence=x took_ms=1 ended_ms=1 by=a",
            "fence=1 took_ms=1 by=a",
            "fence=1 took_ms=1 ended_ms=1",
        ] {
            assert_eq!(LastRun::from_holder(&holder(label)), None, "{label}");
        }
    }

    #[test]
    fn a_name_too_long_for_its_record_is_refused() {
        let fits = "n".repeat(LockName::MAX_BYTES - SUFFIX.len());
        let name = record_name(&LockName::new(&fits).unwrap()).unwrap();
        assert_eq!(name.as_str().len(), LockName::MAX_BYTES);
        let long = LockName::new(format!("{fits}n")).unwrap();
        let err = record_name(&long).unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
    }
}
