//! Presence files: how a waiter knows, at once and for sure, that a holder's
//! process is gone, and what it watches to be woken.
//!
//! Each grant creates `DIR/FENCE` (DIR is `<lock file>-distlock/`, fences
//! never repeat) and its holder keeps an exclusive `flock` on it for as long
//! as it holds the lease; the row records the file's device and inode. The
//! kernel drops a `flock` the moment the last descriptor of its open file
//! closes, and a dying process closes all of them: so a row whose presence
//! file can be `flock`ed by someone else belongs to a dead holder, and is
//! free at once instead of after its TTL. The inode check makes that
//! conclusion sound: an inode is never reused while a descriptor keeps it
//! open, so the same device and inode means the holder's own file, even if
//! someone replaced the path. Anything short of that proof (no file, another
//! inode, any error) counts the holder as alive, and the TTL decides.
//!
//! The same file is the doorbell waiters watch (`notify.rs`): the holder's
//! release closes and removes it, its death closes it, an eviction or a
//! takeover removes it.
//!
//! A writer waiting for a reader-writer lock has one for its intent too,
//! named by a fence taken for it: its client keeps that `flock` itself
//! while the writer waits (`rw/intent.rs`), not in [`KEPT`].

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::error::shown;

/// The directory of presence files of one lock file.
#[derive(Debug, Clone)]
pub(crate) struct Presence {
    dir: PathBuf,
}

/// Where a holder's presence file is: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    pub(crate) dev: i64,
    pub(crate) ino: i64,
}

impl FileId {
    fn of(meta: &std::fs::Metadata) -> FileId {
        // Device and inode numbers are stored as SQLite integers (i64);
        // the cast is a bijection on the bits, so equality is preserved.
        FileId {
            dev: meta.dev() as i64,
            ino: meta.ino() as i64,
        }
    }
}

/// A presence file this process holds the `flock` of.
#[derive(Debug)]
pub(crate) struct PresenceFile {
    /// Open for as long as the grant is held: its `flock` is the proof of life.
    pub(crate) flock: File,
    pub(crate) id: FileId,
    pub(crate) path: PathBuf,
}

impl Presence {
    /// The presence directory next to `db` (`<db>-distlock`), created
    /// (mode 0700) if missing.
    ///
    /// # Errors
    /// When it cannot be created, or the path is not a directory.
    pub(crate) fn open(db: &Path) -> io::Result<Presence> {
        let mut name = db.file_name().unwrap_or_default().to_owned();
        name.push("-distlock");
        let dir = db.with_file_name(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if !std::fs::metadata(&dir)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a directory", shown(&dir)),
            ));
        }
        Ok(Presence { dir })
    }

    /// The presence file of the grant with `fence`.
    pub(crate) fn path(&self, fence: u64) -> PathBuf {
        self.dir.join(fence.to_string())
    }

    /// Creates the presence file of `fence` and takes its `flock`. `Ok(None)`
    /// when that is not possible (the grant then has no presence file, and
    /// only its TTL frees it).
    ///
    /// # Errors
    /// [`Taken`] when a live process holds the `flock` of this fence's file:
    /// the fence was granted before, so the counter went back (a restore).
    pub(crate) fn create(&self, fence: u64) -> Result<Option<PresenceFile>, Taken> {
        let path = self.path(fence);
        let Ok(file) = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| tracing::warn!(path = %shown(&path), error = %e, "cannot create a presence file; this grant is freed by its TTL only"))
        else {
            return Ok(None);
        };
        if !try_flock(&file) {
            // Left alone: it is a live holder's proof of life.
            return Err(Taken);
        }
        let Ok(meta) = file.metadata() else {
            return Ok(None);
        };
        Ok(Some(PresenceFile {
            flock: file,
            id: FileId::of(&meta),
            path,
        }))
    }

    /// [`create`](Self::create), given a moment: a `flock` held for an
    /// instant (another client's probe of the file, or a grant that did not
    /// commit, its file not yet let go) is gone within milliseconds; a live
    /// holder's is not. [`Taken`] once about 100 ms have passed.
    pub(crate) async fn create_when_free(&self, fence: u64) -> Result<Option<PresenceFile>, Taken> {
        let mut pause = std::time::Duration::from_millis(1);
        for _ in 0..7 {
            match self.create(fence) {
                Err(Taken) => tokio::time::sleep(pause).await,
                created => return created,
            }
            pause *= 2;
        }
        self.create(fence)
    }

    /// Whether some process (this one included) holds the `flock` of the
    /// presence file of `fence`.
    pub(crate) fn is_held(&self, fence: u64) -> bool {
        File::open(self.path(fence)).is_ok_and(|file| !try_flock(&file))
    }

    /// Whether the holder of the grant `fence`, whose presence file was
    /// `id`, is provably gone: its file is still there, the same inode, and
    /// nobody holds its `flock`.
    pub(crate) fn holder_gone(&self, fence: u64, id: FileId) -> bool {
        let Ok(file) = File::open(self.path(fence)) else {
            return false;
        };
        let same = file.metadata().is_ok_and(|meta| FileId::of(&meta) == id);
        // Closing `file` releases the probe's own lock at once.
        same && try_flock(&file)
    }

    /// Removes the presence file of `fence` (after its row is gone), which
    /// wakes whoever watches it.
    pub(crate) fn remove(&self, fence: u64) {
        match std::fs::remove_file(self.path(fence)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::debug!(fence, error = %e, "cannot remove a presence file"),
        }
    }

    /// Fences of presence files in the directory (for the sweep of orphans).
    pub(crate) fn fences(&self) -> Vec<u64> {
        std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes the presence file of `fence` if nobody holds its `flock`
    /// (an orphan left by a holder that died between its release and the
    /// removal).
    pub(crate) fn remove_if_unlocked(&self, fence: u64) {
        if let Ok(file) = File::open(self.path(fence))
            && try_flock(&file)
        {
            self.remove(fence);
        }
    }
}

/// The presence file of a fence is held by a live process.
#[derive(Debug)]
pub(crate) struct Taken;

/// Presence files this process holds, by path: kept for as long as their
/// grant may count, whoever made them. Dropping a backend must not free its
/// grants early (a lease outlives the backend that granted it, to its
/// deadline), only the process's death does.
static KEPT: Mutex<Option<HashMap<PathBuf, Kept>>> = Mutex::new(None);

struct Kept {
    flock: File,
    /// The grant's expiry as last written (boot-clock nanoseconds).
    until: i64,
    /// Renewals in flight: the expiry may be moving, keep the file.
    renewing: usize,
}

fn kept() -> MutexGuard<'static, Option<HashMap<PathBuf, Kept>>> {
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keeps `file` (and its `flock`) until its grant ends or expires.
pub(crate) fn keep(file: PresenceFile, until: i64) {
    kept().get_or_insert_with(HashMap::new).insert(
        file.path,
        Kept {
            flock: file.flock,
            until,
            renewing: 0,
        },
    );
}

/// Attached to each lease granted with a presence file, so
/// [`presence_fd`] can find it.
#[derive(Debug)]
pub(crate) struct PresenceOf(pub(crate) PathBuf);

/// A new descriptor (close-on-exec) of the presence file of `lease`, a
/// lease granted by [`SqliteBackend`](crate::SqliteBackend) in this process
/// and not yet ended here: the same open file, so the same `flock`.
///
/// While any copy stays open, the lock counts as held by a live process
/// even after this process dies (until the lease's TTL runs out): hand it to
/// a process that must keep the lock taken for as long as it lives, such as
/// the supervisor of `distlock run`, which holds it until its job and every
/// process the job started are gone. Closing it never frees the lock early.
///
/// `Ok(None)` for a lease of another backend, a grant without a presence
/// file (the TTL alone frees it), or one already released or expired here.
///
/// # Errors
/// When the descriptor cannot be duplicated (e.g. too many open files).
pub fn presence_fd(lease: &lockcore::Lease) -> io::Result<Option<OwnedFd>> {
    let Some(PresenceOf(path)) = lease.extension::<PresenceOf>() else {
        return Ok(None);
    };
    let kept = kept();
    match kept.as_ref().and_then(|k| k.get(path)) {
        Some(kept) => kept.flock.as_fd().try_clone_to_owned().map(Some),
        None => Ok(None),
    }
}

/// Closes the presence file at `path` (its grant ended here).
pub(crate) fn unkeep(path: &Path) {
    let gone = kept().as_mut().and_then(|k| k.remove(path));
    drop(gone);
}

/// Closes every kept presence file whose grant has expired (and is not
/// being renewed): its row no longer counts, so nothing is freed early.
pub(crate) fn close_expired(now: i64) {
    if let Some(k) = kept().as_mut() {
        k.retain(|_, kept| kept.renewing > 0 || kept.until > now);
    }
}

/// A renewal of the grant whose presence file is `path` is in flight.
#[derive(Debug)]
pub(crate) struct Renewing(PathBuf);

impl Renewing {
    /// Marks a renewal of `path` in flight (before the clock is read).
    pub(crate) fn start(path: PathBuf) -> Renewing {
        if let Some(kept) = kept().as_mut().and_then(|k| k.get_mut(&path)) {
            kept.renewing += 1;
        }
        Renewing(path)
    }

    /// The renewal wrote expiry `until`.
    pub(crate) fn extended(&self, until: i64) {
        if let Some(kept) = kept().as_mut().and_then(|k| k.get_mut(&self.0)) {
            kept.until = kept.until.max(until);
        }
    }
}

impl Drop for Renewing {
    fn drop(&mut self) {
        if let Some(kept) = kept().as_mut().and_then(|k| k.get_mut(&self.0)) {
            kept.renewing = kept.renewing.saturating_sub(1);
        }
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: whether we got it.
fn try_flock(file: &File) -> bool {
    // SAFETY: flock on a descriptor we own; no memory is passed.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_file_is_alive_until_closed_and_a_replaced_one_proves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let presence = Presence::open(&dir.path().join("locks.db")).unwrap();
        let held = presence.create(7).unwrap().unwrap();
        assert!(presence.is_held(7));
        assert!(presence.create(7).is_err(), "held: taken");
        assert!(!presence.holder_gone(7, held.id), "held in this process");
        let id = held.id;
        drop(held);
        assert!(!presence.is_held(7));
        assert!(presence.holder_gone(7, id), "closed: gone");
        // Someone replaces the file: another inode proves nothing.
        presence.remove(7);
        let other = presence.create(7).unwrap().unwrap();
        let other_id = other.id;
        drop(other);
        if other_id != id {
            assert!(!presence.holder_gone(7, id));
        }
        presence.remove(7);
        assert!(!presence.holder_gone(7, id), "no file proves nothing");
        assert_eq!(presence.fences(), Vec::<u64>::new());
    }

    #[test]
    fn a_presence_fd_keeps_the_holder_alive_until_it_too_is_closed() {
        use lockcore::{Capabilities, FencingToken, Lease, LockName, OwnerToken};
        let dir = tempfile::tempdir().unwrap();
        let presence = Presence::open(&dir.path().join("locks.db")).unwrap();
        let file = presence.create(9).unwrap().unwrap();
        let (id, path) = (file.id, file.path.clone());
        keep(file, i64::MAX);
        let ttl = Capabilities::new("test")
            .effective_ttl(std::time::Duration::from_secs(1))
            .unwrap();
        let bare = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(9).unwrap(),
            ttl,
            lockcore::backend::Moment::now(),
        );
        assert!(presence_fd(&bare).unwrap().is_none(), "no presence file");
        let lease = bare.with_extension(PresenceOf(path.clone()));
        let fd = presence_fd(&lease).unwrap().expect("kept");
        unkeep(&path);
        assert!(presence_fd(&lease).unwrap().is_none(), "ended here");
        assert!(
            !presence.holder_gone(9, id),
            "the copy still holds the flock"
        );
        drop(fd);
        assert!(presence.holder_gone(9, id), "every copy closed: gone");
    }
}
