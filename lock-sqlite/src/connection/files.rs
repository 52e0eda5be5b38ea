//! The files a client has open, and how it knows they were replaced under
//! it: the lock file, its `-wal` and its `-shm`, by device and inode.
//!
//! While any connection of a client is open none of them is removed or
//! replaced in normal operation (SQLite deletes the `-wal` and `-shm` only
//! when the last connection closes, and this crate's connections never do,
//! see `probe::options`). So another inode under one of those names means
//! the file was swapped while the client ran (a backup copied over it, its
//! `-wal` and `-shm` removed): the client's connections still see the old
//! files, a view of the table no other process shares. Every operation
//! looks first and the client closes itself instead of writing there.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::locks::presence::FileId;

/// The lock file and its two companions, as a client opened them.
#[derive(Debug)]
pub(crate) struct FileSet {
    /// Each file, in words (never its name: see `error::shown`), its path
    /// and its identity when opened.
    files: Vec<(&'static str, PathBuf, Option<FileId>)>,
}

impl FileSet {
    /// The files next to `db` as they are now (right after the client's
    /// first connection opened them).
    pub(crate) fn record(db: &Path) -> FileSet {
        let files = [
            ("the lock file", db.to_owned()),
            ("its -wal", companion(db, "-wal")),
            ("its -shm", companion(db, "-shm")),
        ]
        .into_iter()
        .map(|(what, path)| {
            let id = identify(&path);
            (what, path, id)
        })
        .collect();
        FileSet { files }
    }

    /// What was replaced since [`record`](Self::record), in words; `None`
    /// while every file is the one this client opened.
    pub(crate) fn replaced(&self) -> Option<String> {
        self.files.iter().find_map(|(what, path, recorded)| {
            let recorded = (*recorded)?;
            match identify(path) {
                Some(now) if now == recorded => None,
                Some(_) => Some(format!("{what} is another file than the one opened")),
                None => Some(format!("{what} was removed")),
            }
        })
    }
}

/// `<db><suffix>`, next to it: where SQLite keeps the `-wal` and `-shm`.
pub(crate) fn companion(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_owned();
    name.push(suffix);
    db.with_file_name(name)
}

/// Device and inode of `path`, without opening it: opening and closing a
/// database file would drop every POSIX lock this process's connections
/// hold on it.
fn identify(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|meta| FileId {
        dev: meta.dev() as i64,
        ino: meta.ino() as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_inode_or_a_removal_is_a_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("locks.db");
        for path in [&db, &companion(&db, "-wal"), &companion(&db, "-shm")] {
            std::fs::write(path, b"x").unwrap();
        }
        let set = FileSet::record(&db);
        assert_eq!(set.replaced(), None);
        // Held open, as a connection holds it: its inode is not reused.
        let _open = std::fs::File::open(companion(&db, "-wal")).unwrap();
        // Copied over in place: the same inode, nothing to see here.
        std::fs::write(&db, b"restored").unwrap();
        assert_eq!(set.replaced(), None);
        std::fs::remove_file(companion(&db, "-wal")).unwrap();
        assert_eq!(set.replaced().as_deref(), Some("its -wal was removed"));
        std::fs::write(companion(&db, "-wal"), b"new").unwrap();
        assert_eq!(
            set.replaced().as_deref(),
            Some("its -wal is another file than the one opened")
        );
    }
}
