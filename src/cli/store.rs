//! The default lock store: a SQLite file in the user's state directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use distlock::LockBackend;

use super::exit::{self, Failure};

/// The backend on the SQLite lock file in the user's state directory, its
/// directory created private (0700). Built from the path itself, never
/// through a URL: a directory whose name holds `%`, `?` or `#` is the one
/// opened, not another path decoded from it.
pub(super) async fn default_backend() -> Result<Arc<dyn LockBackend>, Failure> {
    let path = default_path().map_err(|why| Failure::Code(exit::USAGE, why))?;
    let dir = path.parent().unwrap_or(&path);
    private_dir(dir).map_err(|e| {
        Failure::Code(
            exit::USAGE,
            format!(
                "cannot create {} for the default lock file: {e} (or pass --url)",
                dir.display()
            ),
        )
    })?;
    open(&path).await
}

#[cfg(feature = "sqlite")]
async fn open(path: &Path) -> Result<Arc<dyn LockBackend>, Failure> {
    let config = lock_sqlite::SqliteConfig::new(path)?;
    Ok(Arc::new(
        lock_sqlite::SqliteBackend::connect_with(config).await?,
    ))
}

#[cfg(not(feature = "sqlite"))]
async fn open(_path: &Path) -> Result<Arc<dyn LockBackend>, Failure> {
    Err(Failure::Code(
        exit::USAGE,
        "distlock was built without the `sqlite` feature of its default lock file: pass --url"
            .into(),
    ))
}

/// The `sqlite://` URL of the lock file at `path`, escaped so that
/// `--url` opens that very file (`%`, `?`, `#`, spaces and controls).
pub(super) fn url_of(path: &Path) -> String {
    use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
    const ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'?').add(b'#');
    format!(
        "sqlite://{}",
        utf8_percent_encode(&path.to_string_lossy(), ESCAPED)
    )
}

/// `$XDG_STATE_HOME/distlock/locks.db`, else `~/.local/state/distlock/locks.db`,
/// else `<temp dir>/distlock-<uid>/locks.db`.
pub(super) fn default_path() -> Result<PathBuf, String> {
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(state) = absolute("XDG_STATE_HOME") {
        return Ok(state.join("distlock/locks.db"));
    }
    if let Some(home) = absolute("HOME") {
        return Ok(home.join(".local/state/distlock/locks.db"));
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Ok(std::env::temp_dir().join(format!("distlock-{uid}/locks.db")))
}

/// Creates `dir` (and missing parents) with mode 0700, and refuses one that
/// another user owns or others can write: a lock file there could be
/// replaced under us.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of this user",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lock_file_follows_xdg() {
        // One test touches the environment, so no other test races it.
        // SAFETY: no other thread of this test binary reads these variables.
        unsafe {
            std::env::set_var("XDG_STATE_HOME", "/state");
            assert_eq!(
                default_path().unwrap(),
                PathBuf::from("/state/distlock/locks.db")
            );
            std::env::set_var("XDG_STATE_HOME", "relative");
            std::env::set_var("HOME", "/home/u");
            assert_eq!(
                default_path().unwrap(),
                PathBuf::from("/home/u/.local/state/distlock/locks.db")
            );
            std::env::remove_var("XDG_STATE_HOME");
            std::env::remove_var("HOME");
            assert!(default_path().unwrap().starts_with(std::env::temp_dir()));
        }
    }
}
