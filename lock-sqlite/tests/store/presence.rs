//! The presence files of a lock file as another process sees them:
//! `<lock file>-distlock/<fence>`, and whether some process holds the
//! `flock` of one (its grant's proof of life).

use std::path::{Path, PathBuf};

/// The presence file of the grant `fence` of the lock file at `path`.
pub(crate) fn presence(path: &Path, fence: i64) -> PathBuf {
    let mut dir = path.as_os_str().to_owned();
    dir.push("-distlock");
    PathBuf::from(dir).join(fence.to_string())
}

/// Whether some process holds the `flock` of the presence file of `fence`.
pub(crate) fn locked(path: &Path, fence: i64) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(presence(path, fence)) else {
        return false;
    };
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// The fences of the presence files of the lock file at `path` (all, or
/// only those some process holds the `flock` of), in order.
pub(crate) fn presence_files(path: &Path, only_locked: bool) -> Vec<i64> {
    let any = presence(path, 0);
    let dir = any.parent().expect("the presence directory");
    let mut fences: Vec<i64> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|&fence| !only_locked || locked(path, fence))
                .collect()
        })
        .unwrap_or_default();
    fences.sort_unstable();
    fences
}
