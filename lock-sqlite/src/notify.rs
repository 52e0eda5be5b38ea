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

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use lockcore::backend::{CancellationToken, Wakeup};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};

/// What ends a hold, on the presence file: written and closed (release,
/// crash), attributes changed (the link count, on removal), removed, moved.
const MASK: u32 =
    libc::IN_CLOSE_WRITE | libc::IN_ATTRIB | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;

/// One inotify instance and its watches.
#[derive(Debug)]
pub(crate) struct Doorbells {
    shared: Arc<Shared>,
    stop: CancellationToken,
}

#[derive(Debug)]
struct Shared {
    fd: AsyncFd<OwnedFd>,
    watches: Mutex<HashMap<i32, Watch>>,
    /// Fences of held presence files that someone else touched.
    touched: mpsc::UnboundedSender<u64>,
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
            fd,
            watches: Mutex::default(),
            touched,
        });
        let stop = CancellationToken::new();
        tokio::spawn(read_events(shared.clone(), stop.clone()));
        Ok((Doorbells { shared, stop }, rx))
    }

    /// A wake-up for the next change of the presence file at `path`.
    /// `Ok(None)` when the file is already gone.
    pub(crate) fn ring(&self, path: &Path) -> io::Result<Option<Wakeup>> {
        let mut watches = self.shared.lock();
        let wd = match self.shared.add_watch(path) {
            Ok(wd) => wd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let watch = watches.entry(wd).or_insert_with(|| Watch {
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
            .add_watch(path)
            .map_err(|e| tracing::warn!(fence, error = %e, "cannot watch a presence file; an eviction is noticed at the next renewal"))
            .ok()?;
        watches
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
        if let Some(watch) = watches.get_mut(&wd)
            && watch.held == Some(fence)
        {
            watch.held = None;
            self.shared.forget_if_unused(&mut watches, wd);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<i32, Watch>> {
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add_watch(&self, path: &Path) -> io::Result<i32> {
        let path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), path.as_ptr(), MASK) };
        if wd < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(wd)
        }
    }

    /// Removes watch `wd` once nobody waits on it and it is not ours.
    fn forget_if_unused(&self, watches: &mut HashMap<i32, Watch>, wd: i32) {
        if watches
            .get(&wd)
            .is_some_and(|w| w.waiters == 0 && w.held.is_none())
        {
            watches.remove(&wd);
            // SAFETY: a valid descriptor; an already removed watch only errs.
            unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
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
            let Some(watch) = watches.get(&wd) else {
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
                watches.remove(&wd);
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
        if let Some(watch) = watches.get_mut(&self.wd) {
            watch.waiters = watch.waiters.saturating_sub(1);
            self.shared.forget_if_unused(&mut watches, self.wd);
        }
    }
}

/// The reader task: until the backend is dropped.
async fn read_events(shared: Arc<Shared>, stop: CancellationToken) {
    let mut buf = vec![0_u8; 16 * 1024];
    loop {
        let mut ready = tokio::select! {
            _ = stop.cancelled() => return,
            ready = shared.fd.readable() => match ready {
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

/// A wake-up that fires at once: something changed before it was armed.
pub(crate) fn now() -> Wakeup {
    Box::pin(std::future::ready(()))
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
