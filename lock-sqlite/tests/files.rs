//! The lock file itself: bad paths and files that are not ours get a clear
//! `InvalidConfig` and are never changed (a file with two names or that is
//! a mount point included: each name would get a write-ahead log of its
//! own); fences survive every process closing the file and reopening it; a
//! row of an earlier boot is expired.

use std::path::Path;
use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{FencingToken, LockBackend, LockError, LockName};
use sqlx::Connection;

fn url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

fn name(n: &str) -> LockName {
    LockName::new(n).unwrap()
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
    let err = SqliteBackend::connect(&url(path)).await.unwrap_err();
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
    let backend = SqliteBackend::connect(&url(&path)).await.unwrap();
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
    let err = SqliteBackend::connect(&url(dir.path())).await.unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

#[tokio::test]
async fn an_empty_file_becomes_a_private_lock_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    SqliteBackend::connect(&url(&empty)).await.unwrap();
    let fresh = dir.path().join("fresh.db");
    SqliteBackend::connect(&url(&fresh)).await.unwrap();
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a new lock file is private: {mode:o}");
    let presence = std::fs::metadata(dir.path().join("fresh.db-distlock")).unwrap();
    assert_eq!(presence.permissions().mode() & 0o777, 0o700);
}

#[tokio::test]
async fn fences_survive_every_client_closing_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let n = name("reopen");
    let mut last = 0;
    for round in 0..3 {
        let backend = SqliteBackend::connect(&url(&path)).await.unwrap();
        for _ in 0..10 {
            let lease = backend
                .try_acquire_for(&n, Duration::from_secs(60))
                .await
                .unwrap()
                .into_lease()
                .unwrap();
            assert!(
                lease.fence().get() > last,
                "round {round}: {} <= {last}",
                lease.fence()
            );
            last = lease.fence().get();
            backend.release(&lease).await.unwrap();
        }
        // A floor far ahead, as after restoring a backup.
        if round == 1 {
            backend
                .raise_fence_floor(FencingToken::new(last + 1000).unwrap())
                .await
                .unwrap();
            last += 1000;
        }
        backend.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_row_of_an_earlier_boot_is_expired() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let a = SqliteBackend::connect(&url(&path)).await.unwrap();
    let n = name("rebooted");
    let old = a
        .try_acquire_for(&n, Duration::from_secs(3600))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    // The holder "died with its boot": its row names another boot id (and
    // its process, this one, no longer counts: close it).
    a.close().await.unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&url(&path)).await.unwrap();
    sqlx::query("UPDATE distlock_leases SET boot_id = 'an-earlier-boot', presence_dev = NULL")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let b = SqliteBackend::connect(&url(&path)).await.unwrap();
    assert!(b.inspect(&n).await.unwrap().is_none());
    let next = b
        .try_acquire_for(&n, Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .expect("a row of an earlier boot is free");
    assert!(next.fence() > old.fence());
}

/// A lock file with a second name (a hard link, as a container given the
/// file under another path would have): refused under either name, since
/// each would get its own `-wal` and `-shm`.
#[tokio::test]
async fn a_lock_file_with_two_names_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let backend = SqliteBackend::connect(&url(&path)).await.unwrap();
    backend.close().await.unwrap();
    let other = dir.path().join("other-name.db");
    std::fs::hard_link(&path, &other).unwrap();
    for name in [&path, &other] {
        refused(name, "has 2 names (hard links)").await;
        refused(name, "bind-mount its directory").await;
    }
    std::fs::remove_file(&other).unwrap();
    SqliteBackend::connect(&url(&path))
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
    let backend = SqliteBackend::connect(&url(&source)).await.unwrap();
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
    SqliteBackend::connect(&url(&target))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
}
