//! Wake-ups and eviction notices through the kernel: one inotify instance
//! per backend watching presence files (see `presence.rs`).
//!
//! A waiter watches the current holder's presence file; what ends a hold
//! always changes that file: a release closes and removes it, a crash closes
//! it (the kernel closes every descriptor of a dead process), an eviction or
//! a takeover removes it. A holder watches its own presence file too: when
//! someone else removes it, the lease was evicted or taken over, and the
//! holder is told at once instead of at its next renewal. Expiry changes
//! nothing on disk; waiters retry at the holder's expiry instead.
//!
//! The instance's descriptor belongs to its reader task, which closes it
//! when it ends ([`Doorbells::close`], or dropping the backend); nothing
//! else uses the descriptor once the task has marked the instance closed.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use lockcore::backend::CancellationToken;
use lockcore::backend::wait::Wakeup;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// What ends a hold, on the presence file: written and closed (release,
/// crash), attributes changed (the link count, on removal), removed, moved.
const MASK: u32 =
    libc::IN_CLOSE_WRITE | libc::IN_ATTRIB | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;

/// One inotify instance and its watches.
#[derive(Debug)]
pub(crate) struct Doorbells {
    shared: Arc<Shared>,
    stop: CancellationToken,
    /// The reader task, which owns the descriptor.
    reader: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    /// The instance's descriptor, valid while `Watches::open`.
    raw: RawFd,
    watches: Mutex<Watches>,
    /// Fences of held presence files that someone else touched.
    touched: mpsc::UnboundedSender<u64>,
}

#[derive(Debug)]
struct Watches {
    /// Whether `Shared::raw` is still open; cleared, with every watch, by
    /// the reader task before it closes the descriptor.
    open: bool,
    by_wd: HashMap<i32, Watch>,
}

#[derive(Debug)]
struct Watch {
    waiters: usize,
    ring: watch::Sender<()>,
    /// The fence of our own grant whose presence file this is.
    held: Option<u64>,
}

impl Drop for Doorbells {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Doorbells {
    /// A new inotify instance and its reader task (inside a tokio runtime).
    /// The receiver gets the fence of every held presence file someone
    /// touched.
    ///
    /// # Errors
    /// When the kernel refuses an instance (`max_user_instances`).
    pub(crate) fn new() -> io::Result<(Doorbells, mpsc::UnboundedReceiver<u64>)> {
        // SAFETY: no pointers; the result is checked.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let (touched, rx) = mpsc::unbounded_channel();
        // SAFETY: the OwnedFd stays open and unchanged inside the AsyncFd
        // for its whole life.
        let fd = unsafe { AsyncFd::register(fd)? };
        let shared = Arc::new(Shared {
            raw,
            watches: Mutex::new(Watches {
                open: true,
                by_wd: HashMap::new(),
            }),
            touched,
        });
        let stop = CancellationToken::new();
        let reader = tokio::spawn(read_events(shared.clone(), fd, stop.clone()));
        Ok((
            Doorbells {
                shared,
                stop,
                reader: Mutex::new(Some(reader)),
            },
            rx,
        ))
    }

    /// Ends the reader task, which closes the instance: every waiter wakes
    /// (and polls from then on), nothing is watched any more. Returns once
    /// the descriptor is closed.
    pub(crate) async fn close(&self) {
        self.stop.cancel();
        let reader = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(reader) = reader {
            let _ = reader.await;
        }
    }

    /// A wake-up for the next change of the presence file at `path`.
    /// `Ok(None)` when the file is already gone, or the instance is closed.
    pub(crate) fn ring(&self, path: &Path) -> io::Result<Option<Wakeup>> {
        let mut watches = self.shared.lock();
        let wd = match self.shared.add_watch(&watches, path) {
            Ok(Some(wd)) => wd,
            Ok(None) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let watch = watches.by_wd.entry(wd).or_insert_with(|| Watch {
            waiters: 0,
            ring: watch::channel(()).0,
            held: None,
        });
        watch.waiters += 1;
        let mut rx = watch.ring.subscribe();
        let guard = Subscription {
            shared: self.shared.clone(),
            wd,
        };
        Ok(Some(Box::pin(async move {
            let _guard = guard;
            // A closed channel (the watch went away) is a change too.
            let _ = rx.changed().await;
        })))
    }

    /// Watches our own presence file of grant `fence`, so an eviction or
    /// takeover is reported. Returns the watch to give back to [`unhold`](Self::unhold).
    pub(crate) fn hold(&self, path: &Path, fence: u64) -> Option<i32> {
        let mut watches = self.shared.lock();
        let wd = self
            .shared
            .add_watch(&watches, path)
            .map_err(|e| tracing::warn!(fence, error = %e, "cannot watch a presence file; an eviction is noticed at the next renewal"))
            .ok()??;
        watches
            .by_wd
            .entry(wd)
            .or_insert_with(|| Watch {
                waiters: 0,
                ring: watch::channel(()).0,
                held: None,
            })
            .held = Some(fence);
        Some(wd)
    }

    /// Stops watching our own presence file (released, or lost).
    pub(crate) fn unhold(&self, wd: i32, fence: u64) {
        let mut watches = self.shared.lock();
        if let Some(watch) = watches.by_wd.get_mut(&wd)
            && watch.held == Some(fence)
        {
            watch.held = None;
            self.shared.forget_if_unused(&mut watches, wd);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Watches> {
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a watch of `path` (`None` once the instance is closed); called
    /// with the watches locked, so the descriptor cannot close meanwhile.
    fn add_watch(&self, watches: &Watches, path: &Path) -> io::Result<Option<i32>> {
        if !watches.open {
            return Ok(None);
        }
        let path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: an open descriptor (checked above, under the lock) and a
        // NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(self.raw, path.as_ptr(), MASK) };
        if wd < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(Some(wd))
        }
    }

    /// Removes watch `wd` once nobody waits on it and it is not ours.
    fn forget_if_unused(&self, watches: &mut Watches, wd: i32) {
        if watches
            .by_wd
            .get(&wd)
            .is_some_and(|w| w.waiters == 0 && w.held.is_none())
        {
            watches.by_wd.remove(&wd);
            if watches.open {
                // SAFETY: an open descriptor (under the lock); an already
                // removed watch only errs.
                unsafe { libc::inotify_rm_watch(self.raw, wd) };
            }
        }
    }

    /// Dispatches the events in `buf`.
    fn dispatch(&self, buf: &[u8]) {
        let mut watches = self.lock();
        let mut at = 0;
        while at + 16 <= buf.len() {
            let word = |i: usize| {
                let bytes = [
                    buf[at + i],
                    buf[at + i + 1],
                    buf[at + i + 2],
                    buf[at + i + 3],
                ];
                u32::from_ne_bytes(bytes)
            };
            let wd = word(0) as i32;
            let mask = word(4);
            let len = word(12) as usize;
            at += 16 + len;
            let Some(watch) = watches.by_wd.get(&wd) else {
                continue;
            };
            watch.ring.send_replace(());
            if let Some(fence) = watch.held
                && mask & (libc::IN_ATTRIB | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0
            {
                let _ = self.touched.send(fence);
            }
            if mask & libc::IN_IGNORED != 0 {
                // The kernel dropped the watch (the file is gone): waiters see
                // their channel close, which wakes them.
                watches.by_wd.remove(&wd);
            }
        }
    }
}

/// A waiter's hold on a watch, given back when its wake-up is dropped.
struct Subscription {
    shared: Arc<Shared>,
    wd: i32,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut watches = self.shared.lock();
        if let Some(watch) = watches.by_wd.get_mut(&self.wd) {
            watch.waiters = watch.waiters.saturating_sub(1);
            self.shared.forget_if_unused(&mut watches, self.wd);
        }
    }
}

/// The reader task: until stopped (close, or the backend dropped) or the
/// instance fails. It owns the descriptor: on the way out it marks the
/// instance closed and drops every watch (their waiters wake and poll from
/// then on), then closes the descriptor.
async fn read_events(shared: Arc<Shared>, fd: AsyncFd<OwnedFd>, stop: CancellationToken) {
    read_until_stopped(&shared, &fd, &stop).await;
    let dropped = {
        let mut watches = shared.lock();
        watches.open = false;
        std::mem::take(&mut watches.by_wd)
    };
    drop(dropped);
    drop(fd);
}

async fn read_until_stopped(shared: &Shared, fd: &AsyncFd<OwnedFd>, stop: &CancellationToken) {
    let mut buf = vec![0_u8; 16 * 1024];
    loop {
        let mut ready = tokio::select! {
            _ = stop.cancelled() => return,
            ready = fd.readable() => match ready {
                Ok(ready) => ready,
                Err(e) => {
                    tracing::warn!(error = %e, "inotify failed; waiters fall back to polling");
                    return;
                }
            },
        };
        let read = ready.try_io(|fd| {
            // SAFETY: reading into a buffer we own, of its length.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match read {
            Ok(Ok(n)) => shared.dispatch(&buf[..n]),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading inotify events failed; waiters fall back to polling");
                return;
            }
            Err(_would_block) => {}
        }
    }
}

/// A wake-up that fires when the first of `wakeups` does (or at once when
/// there are none).
pub(crate) fn first_of(wakeups: Vec<Wakeup>) -> Wakeup {
    Box::pin(FirstOf(wakeups))
}

struct FirstOf(Vec<Wakeup>);

impl Future for FirstOf {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.is_empty() {
            return Poll::Ready(());
        }
        for wakeup in &mut self.0 {
            if wakeup.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_write_close_or_removal_rings_and_ours_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1");
        let file = std::fs::File::create(&path).unwrap();
        let (bells, mut touched) = Doorbells::new().unwrap();
        let ring = bells.ring(&path).unwrap().expect("the file exists");
        let wd = bells.hold(&path, 1).unwrap();
        drop(file); // a writer closes it: a release or a crash
        tokio::time::timeout(Duration::from_secs(5), ring)
            .await
            .unwrap();
        let ring = bells.ring(&path).unwrap().unwrap();
        std::fs::remove_file(&path).unwrap(); // an eviction
        tokio::time::timeout(Duration::from_secs(5), ring)
            .await
            .unwrap();
        let fence = tokio::time::timeout(Duration::from_secs(5), touched.recv()).await;
        assert_eq!(fence.unwrap(), Some(1));
        bells.unhold(wd, 1);
        assert!(
            bells.ring(&path).unwrap().is_none(),
            "a missing file rings nothing"
        );
    }
}
