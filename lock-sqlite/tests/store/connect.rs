//! Connecting: the URL's options (each spelling, old ones with a warning;
//! a bad value or an unknown option is a clear `InvalidConfig`), and the
//! lock file itself: bad paths and files that are not ours get a clear
//! `InvalidConfig` and are never changed (a file with two names or that is
//! a mount point included: each name would get a write-ahead log of its
//! own).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::secrets;
use lock_sqlite::{SqliteBackend, SqliteConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError};
use sqlx::Connection;

use crate::support::{self, name};

/// What `tracing` logs on this thread while `f` runs (every level).
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&buffer.0.lock().unwrap()).into_owned();
    (out, text)
}

/// `timeout` is a duration (`250ms`, `2s`); the old `timeout_ms=N` is still
/// read, with a warning naming the new spelling; given both, the new one
/// wins. Each connects.
#[tokio::test]
async fn each_spelling_of_the_timeout_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let url = support::url(&dir.path().join("locks.db"));
    for (query, timeout, warns) in [
        ("timeout=250ms", Duration::from_millis(250), false),
        ("timeout=2s", Duration::from_secs(2), false),
        ("timeout_ms=250", Duration::from_millis(250), true),
        ("timeout_ms=100&timeout=3s", Duration::from_secs(3), true),
    ] {
        let url = format!("{url}?{query}");
        let (config, log) = logged(|| url.parse::<SqliteConfig>());
        assert_eq!(config.unwrap().op_timeout(), timeout, "{query}");
        let warned = log.contains("WARN") && log.contains("timeout_ms is renamed timeout");
        assert_eq!(warned, warns, "{query}: logged {log:?}");
        SqliteBackend::connect(&url)
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
    }
}

/// A value that is no duration, under either spelling, is `InvalidConfig`
/// naming the option; neither the error nor the log shows the value (the
/// kit's marker password, raw and percent-encoded: a secret given the
/// wrong name).
#[test]
fn a_bad_timeout_is_invalid_config_and_shows_no_value() {
    let dir = tempfile::tempdir().unwrap();
    let url = support::url(&dir.path().join("locks.db"));
    let encoded = secrets::encoded();
    for (option, value) in [
        ("timeout", "5"),
        ("timeout", "soon"),
        ("timeout", secrets::MARKER),
        ("timeout", encoded.as_str()),
        ("timeout_ms", "5s"),
        ("timeout_ms", secrets::MARKER),
        ("timeout_ms", encoded.as_str()),
    ] {
        let (parsed, log) = logged(|| format!("{url}?{option}={value}").parse::<SqliteConfig>());
        let err = parsed.unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("URL option {option}:")),
            "{option}={value}: {message}"
        );
        secrets::assert_hidden("the error", &message);
        secrets::assert_hidden("the error's Debug", &format!("{err:?}"));
        secrets::assert_hidden("the log", &log);
        assert!(
            !message.contains(&format!("={value}")),
            "{message} shows {value:?}"
        );
    }
}

/// An unknown option is named with the known ones; text after a `?` that
/// is no option name (a `?` of the path, or a password) is not shown.
#[test]
fn an_unknown_option_names_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let url = support::url(&dir.path().join("locks.db"));
    let err = format!("{url}?tiemout=1s")
        .parse::<SqliteConfig>()
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("unknown sqlite URL option \"tiemout\" (known: timeout)"),
        "{message}"
    );
    for query in [
        format!("{}=1", secrets::MARKER),
        format!("Secret{}", secrets::encoded()),
    ] {
        let err = format!("{url}?{query}")
            .parse::<SqliteConfig>()
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("known: timeout"), "{message}");
        secrets::assert_hidden("the error", &message);
        assert!(!message.contains("Secret"), "{message}");
    }
}

/// Connecting to `path` fails with `InvalidConfig` mentioning `why`, and
/// leaves the file's bytes and its directory's entries as they were.
async fn refused(path: &Path, why: &str) {
    let before = std::fs::read(path).ok();
    let siblings = |p: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .map(|d| d.filter_map(|e| Some(e.ok()?.file_name())).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    let entries = siblings(path);
    let err = SqliteBackend::connect(&support::url(path))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::InvalidConfig { .. }),
        "{}: {err:?}",
        path.display()
    );
    let message = err.to_string();
    assert!(message.contains(why), "{message:?} should say {why:?}");
    assert!(!message.contains('\n'), "one line: {message:?}");
    assert_eq!(std::fs::read(path).ok(), before, "the file was changed");
    assert_eq!(siblings(path), entries, "files appeared next to it");
}

#[tokio::test]
async fn a_missing_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    refused(&dir.path().join("nope/locks.db"), "does not exist").await;
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(40)).unwrap();
    refused(&path, "is not a SQLite database").await;
}

#[tokio::test]
async fn another_programs_database_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let mut conn =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
    sqlx::query("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users (name) VALUES ('ada')")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    refused(&path, "database of another program").await;
    // Not even its journal mode changed: still the rollback journal.
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(mode, "delete");
}

/// Makes `path` read-only for this process: mode 0444, and immutable when
/// running as root (who writes through any mode).
struct ReadOnly<'a>(&'a Path);

impl<'a> ReadOnly<'a> {
    fn new(path: &'a Path) -> Option<Self> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let done = std::process::Command::new("chattr")
                .arg("+i")
                .arg(path)
                .status()
                .is_ok_and(|s| s.success());
            if !done {
                eprintln!(
                    "SKIP: running as root without chattr +i, the file cannot be made read-only"
                );
                return None;
            }
        }
        Some(ReadOnly(path))
    }
}

impl Drop for ReadOnly<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(self.0)
            .status();
    }
}

#[tokio::test]
async fn a_read_only_file_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    let lease = backend
        .try_acquire_for(&name("a"), Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    backend.release(&lease).await.unwrap();
    backend.close().await.unwrap();
    drop(backend);
    let Some(_read_only) = ReadOnly::new(&path) else {
        return;
    };
    refused(&path, "read-only").await;
}

#[tokio::test]
async fn memory_databases_and_directories_are_refused() {
    for bad in [
        "sqlite::memory:",
        "sqlite://:memory:",
        "sqlite://x.db?mode=memory",
    ] {
        let err = SqliteBackend::connect(bad).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains("across processes"), "{err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteBackend::connect(&support::url(dir.path()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

#[tokio::test]
async fn an_empty_file_becomes_a_private_lock_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    SqliteBackend::connect(&support::url(&empty)).await.unwrap();
    let fresh = dir.path().join("fresh.db");
    SqliteBackend::connect(&support::url(&fresh)).await.unwrap();
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a new lock file is private: {mode:o}");
    let presence = std::fs::metadata(dir.path().join("fresh.db-distlock")).unwrap();
    assert_eq!(presence.permissions().mode() & 0o777, 0o700);
}

/// A lock file with a second name (a hard link, as a container given the
/// file under another path would have): refused under either name, since
/// each would get its own `-wal` and `-shm`.
#[tokio::test]
async fn a_lock_file_with_two_names_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    backend.close().await.unwrap();
    let other = dir.path().join("other-name.db");
    std::fs::hard_link(&path, &other).unwrap();
    for name in [&path, &other] {
        refused(name, "has 2 names (hard links)").await;
        refused(name, "bind-mount its directory").await;
    }
    std::fs::remove_file(&other).unwrap();
    SqliteBackend::connect(&support::url(&path))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
}

/// Unmounts a bind mount when dropped.
struct BindMount(std::path::PathBuf);

impl BindMount {
    /// `source` bind-mounted on `target`, or `None` (saying why) where this
    /// process may not mount.
    fn new(source: &Path, target: &Path) -> Option<BindMount> {
        let mounted = std::process::Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(target)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("SKIP: cannot bind-mount here (needs root and mount(8))");
            return None;
        }
        Some(BindMount(target.to_owned()))
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        // Lazy: detached even while a failed test still has the file open.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A lock file that is a mount point, as when a single file is bind-mounted
/// into a container (here within one file system, so the device number
/// says nothing: /proc/self/mountinfo does): refused, saying to bind-mount
/// the directory.
#[tokio::test]
async fn a_lock_file_that_is_a_mount_point_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (host, inside) = (dir.path().join("host"), dir.path().join("container"));
    std::fs::create_dir(&host).unwrap();
    std::fs::create_dir(&inside).unwrap();
    let (source, target) = (host.join("locks.db"), inside.join("locks.db"));
    let backend = SqliteBackend::connect(&support::url(&source))
        .await
        .unwrap();
    backend.close().await.unwrap();
    std::fs::write(&target, b"").unwrap();
    let Some(_mounted) = BindMount::new(&source, &target) else {
        return;
    };
    refused(&target, "is a mount point").await;
    refused(&target, "bind-mount the directory that holds the lock file").await;
    // The directory bind-mounted instead is what works.
    drop(_mounted);
    std::fs::remove_file(&target).unwrap();
    let Some(_mounted) = BindMount::new(&host, &inside) else {
        return;
    };
    SqliteBackend::connect(&support::url(&target))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
}
