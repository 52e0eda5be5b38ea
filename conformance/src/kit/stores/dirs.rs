//! Where launched stores keep their data and logs: fresh temp dirs (swept
//! when a crashed run left them behind), file modes, the faketime clock file.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{Kind, process};
use crate::kit::env;

/// A fresh data dir `distlock-<kind>-<pid>-XXXX` under [`temp_root`],
/// world-traversable (the PostgreSQL user must enter it).
pub(crate) fn data_dir(kind: Kind) -> io::Result<tempfile::TempDir> {
    sweep_stale_dirs();
    let dir = tempfile::Builder::new()
        .prefix(&format!("distlock-{}-{}-", kind.name(), std::process::id()))
        .tempdir_in(temp_root())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create a data dir in {}: {e}", temp_root().display()),
            )
        })?;
    set_mode(dir.path(), 0o755)?;
    Ok(dir)
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

pub(super) fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open log {}: {e}", path.display())))
}

pub(crate) fn write_clock_file(path: &Path, seconds: i64) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, format!("{seconds:+}\n"))?;
    set_mode(&tmp, 0o644)?;
    fs::rename(&tmp, path)
}

/// The last `max` bytes of a log file, for error messages.
pub(crate) fn tail(path: &Path, max: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max);
            let text = String::from_utf8_lossy(&bytes[start..]).into_owned();
            if start > 0 {
                format!("…{text}")
            } else {
                text
            }
        }
        Err(e) => format!("(no log at {}: {e})", path.display()),
    }
}

/// Where store data dirs go: `LOCK_TEST_TMPDIR`, else the system temp dir.
/// It must be traversable by the unprivileged PostgreSQL user, so not /root.
pub(crate) fn temp_root() -> PathBuf {
    env::TMPDIR
        .get()
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// Removes data dirs left by test binaries that died without cleaning up
/// (named `distlock-<kind>-<pid>-*`), once per process.
pub(crate) fn sweep_stale_dirs() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        let Ok(entries) = fs::read_dir(temp_root()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name.strip_prefix("distlock-") else {
                continue;
            };
            let pid = rest.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && pid != std::process::id()
                && !process::alive(pid)
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    });
}
