//! `RecordingResource`: a fenced resource that remembers every write it was
//! asked to make, and which of them came after the writer's lease was lost.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Fenced, FencedResource, FencingToken, LockGuard};

/// A [`FencedResource`] that records every *attempted* write: its fence,
/// when it came, whether the fence check let it through, and whether the
/// lease behind that fence had already been lost.
///
/// Tell it which guard writes with which fence ([`watch`](Self::watch));
/// then [`assert_no_write_after_loss`](Self::assert_no_write_after_loss)
/// fails the test if the application tried to write after that guard's
/// `lost()` fired, even when the fence check refused the write: a refused
/// write means the application kept going after it was told to stop, and a
/// real resource may not check fences everywhere.
///
/// "After" is exact, not a comparison of timestamps: a write counts when the
/// guard's loss signal had fired at the moment the write was attempted.
pub struct RecordingResource<T> {
    resource: FencedResource<T>,
    record: Mutex<Record>,
    /// One task per watched guard, noting when its loss fired; aborted
    /// with the resource.
    watchers: Mutex<JoinSet<()>>,
}

#[derive(Default)]
struct Record {
    attempts: Vec<WriteAttempt>,
    watched: HashMap<FencingToken, Loss>,
}

/// A watched guard's loss: the signal, and when it fired.
#[derive(Clone)]
struct Loss {
    signal: CancellationToken,
    at: Arc<OnceLock<Instant>>,
}

impl Loss {
    /// How long before `now` the loss fired, if it has.
    fn before(&self, now: Instant) -> Option<Duration> {
        if !self.signal.is_cancelled() {
            return None;
        }
        // The watcher notes the instant when it next runs; until then the
        // loss is as recent as it gets.
        Some(self.at.get().map_or(Duration::ZERO, |at| now - *at))
    }
}

/// One write the application asked a [`RecordingResource`] to make.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteAttempt {
    /// The fence the write carried.
    pub fence: FencingToken,
    /// When it was attempted (tokio's clock).
    pub at: Instant,
    /// Applied, or refused by the fence check.
    pub outcome: Fenced<()>,
    /// `Some` when the guard watched for this fence had already lost its
    /// lease: how long after the loss was signalled the write came.
    pub after_loss: Option<Duration>,
}

impl fmt::Display for WriteAttempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a write with fence {}", self.fence)?;
        if let Some(late) = self.after_loss {
            write!(f, " {late:?} after its guard's lost() fired")?;
        }
        match &self.outcome {
            Ok(()) => write!(f, ", applied"),
            Err(refused) => write!(f, ", refused ({refused})"),
        }
    }
}

/// The writes an application attempted after their guard's lease was lost:
/// what [`RecordingResource::check_no_write_after_loss`] reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct WritesAfterLoss {
    /// Each such write, in the order attempted.
    pub writes: Vec<WriteAttempt>,
}

impl fmt::Display for WritesAfterLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} write(s) attempted after the lease was lost:",
            self.writes.len()
        )?;
        for write in &self.writes {
            write!(f, "\n  {write}")?;
        }
        Ok(())
    }
}

impl<T> RecordingResource<T> {
    /// A resource holding `value`, nothing recorded yet.
    pub fn new(value: T) -> Self {
        RecordingResource {
            resource: FencedResource::new(value),
            record: Mutex::default(),
            watchers: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, writes with `guard`'s fence are judged against its loss:
    /// one attempted once `guard.lost()` has fired is a write after loss.
    /// Watch every guard (or [`Leadership::guard`](crate::Leadership::guard))
    /// whose fence reaches the resource. Call it inside a tokio runtime.
    pub fn watch(&self, guard: &LockGuard) {
        let loss = Loss {
            signal: guard.lost_token(),
            at: Arc::default(),
        };
        let (signal, at) = (loss.signal.clone(), loss.at.clone());
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .spawn(async move {
                signal.cancelled().await;
                let _ = at.set(Instant::now());
            });
        self.lock().watched.insert(guard.fencing_token(), loss);
    }

    /// Records the attempt, then applies `update` if `fence` is not older
    /// than every fence applied so far ([`FencedResource::write`]).
    ///
    /// # Errors
    /// [`StaleToken`](crate::StaleToken) when a newer fence was applied.
    pub fn write<R>(&self, fence: FencingToken, update: impl FnOnce(&mut T) -> R) -> Fenced<R> {
        let at = Instant::now();
        let mut record = self.lock();
        let after_loss = record.watched.get(&fence).and_then(|loss| loss.before(at));
        let written = self.resource.write(fence, update);
        record.attempts.push(WriteAttempt {
            fence,
            at,
            outcome: written.as_ref().map(|_| ()).map_err(|refused| *refused),
            after_loss,
        });
        written
    }

    /// Every write attempted, in order.
    pub fn attempts(&self) -> Vec<WriteAttempt> {
        self.lock().attempts.clone()
    }

    /// The writes attempted after their guard's loss was signalled.
    pub fn writes_after_loss(&self) -> Vec<WriteAttempt> {
        self.lock()
            .attempts
            .iter()
            .filter(|write| write.after_loss.is_some())
            .cloned()
            .collect()
    }

    /// `Ok` if no write was attempted after its guard's loss was signalled.
    ///
    /// # Errors
    /// [`WritesAfterLoss`], listing them.
    pub fn check_no_write_after_loss(&self) -> Result<(), WritesAfterLoss> {
        let writes = self.writes_after_loss();
        if writes.is_empty() {
            Ok(())
        } else {
            Err(WritesAfterLoss { writes })
        }
    }

    /// Fails the test if a write was attempted after its guard's loss was
    /// signalled.
    ///
    /// # Panics
    /// With the list of such writes.
    #[track_caller]
    pub fn assert_no_write_after_loss(&self) {
        if let Err(late) = self.check_no_write_after_loss() {
            panic!("{late}");
        }
    }
}

impl<T: Clone> RecordingResource<T> {
    /// A copy of the current value.
    pub fn read(&self) -> T {
        self.resource.read()
    }
}

impl<T: fmt::Debug> fmt::Debug for RecordingResource<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let record = self.lock();
        f.debug_struct("RecordingResource")
            .field("resource", &self.resource)
            .field("attempts", &record.attempts.len())
            .field("watched", &record.watched.keys().collect::<Vec<_>>())
            .finish()
    }
}
