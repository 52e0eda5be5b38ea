//! What is checked at connect, before anything is written: the file is on
//! a local file system, has one name and is no mount point, is writable,
//! and is either new, empty, or a distlock lock file. A file that is not
//! ours is never written to (not even its journal mode), and the error says
//! why.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockcore::LockError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, Sqlite, TransactionManager};

use crate::error::{self, code, shown};
use crate::keys;

/// File systems where SQLite's locks (and `flock`) are not shared between
/// hosts, or not reliably enforced: network and cluster file systems, and
/// FUSE (sshfs, GlusterFS, virtiofs, s3fs, ...: each daemon implements
/// locking its own way, or not at all). `statfs` magic numbers.
const NOT_LOCAL_FS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x0102_1997, "9p"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x6B41_4653, "kAFS"),
    (0x0BD0_0BD0, "Lustre"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
    (0x4750_4653, "GPFS"),
    (0x1983_0326, "BeeGFS"),
    (0x2003_0528, "OrangeFS"),
    (0xAAD7_AAEA, "PanFS"),
    (0x7375_7245, "Coda"),
    (0x786F_4256, "VirtualBox shared folder"),
    (
        0x6573_5546,
        "FUSE (fuse, fuseblk: sshfs, GlusterFS, virtiofs, ...)",
    ),
];

/// The absolute path of the lock file, its directory and itself checked.
///
/// # Errors
/// [`LockError::InvalidConfig`] for a missing or unwritable directory, a
/// network, cluster or FUSE file system, a path that is not a regular file,
/// a file with more than one name (hard links) or that is a mount point,
/// or a file this user cannot write.
pub(crate) fn check_path(path: &Path) -> Result<PathBuf, LockError> {
    let path = std::path::absolute(path)
        .map_err(|e| LockError::config_caused_by(format!("cannot resolve {}", shown(path)), e))?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(LockError::config(format!(
                "{} is not a directory: the lock file {} cannot be created there",
                shown(dir),
                shown(&path)
            )));
        }
        Err(e) => {
            return Err(LockError::config_caused_by(
                format!(
                    "the directory {} of the lock file does not exist or cannot be read (create it first)",
                    shown(dir)
                ),
                e,
            ));
        }
    }
    if let Some(fs) = not_local_fs(dir) {
        return Err(LockError::config(format!(
            "{} is on {fs}: SQLite's locks (and the presence files' flocks) are not shared across \
             hosts there, or not reliably enforced, so two holders could coexist; put the lock \
             file on a local file system",
            shown(&path)
        )));
    }
    if !writable(dir) {
        return Err(LockError::config(format!(
            "the directory {} is not writable for this user: SQLite keeps its write-ahead log next \
             to the lock file",
            shown(dir)
        )));
    }
    let meta = match std::fs::metadata(&path) {
        Ok(meta) => meta,
        Err(_) => return Ok(path),
    };
    if !meta.is_file() {
        return Err(LockError::config(format!(
            "{} exists and is not a regular file",
            shown(&path)
        )));
    }
    if meta.nlink() > 1 {
        return Err(LockError::config(format!(
            "{} has {} names (hard links): SQLite keeps the -wal and -shm next to the name a \
             process opens, so processes using different names would each keep a log of their \
             own (two holders, then a corrupt file); give the lock file one name (to share it with \
             a container, bind-mount its directory)",
            shown(&path),
            meta.nlink()
        )));
    }
    if is_mount_point(&path) {
        return Err(LockError::config(format!(
            "{} is a mount point (a single file bind-mounted, say into a container): SQLite keeps \
             the -wal and -shm, and distlock its -distlock/ presence files, next to the lock file, \
             so each side of the mount would keep its own (two holders, then a corrupt file); \
             bind-mount the directory that holds the lock file instead",
            shown(&path)
        )));
    }
    if !writable(&path) {
        return Err(LockError::config(format!(
            "{} is read-only for this user: distlock writes every grant to its lock file",
            shown(&path)
        )));
    }
    Ok(path)
}

fn not_local_fs(dir: &Path) -> Option<&'static str> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statfs is a valid out-parameter; the path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between platforms
    let kind = stat.f_type as i64;
    NOT_LOCAL_FS
        .iter()
        .find(|(magic, _)| *magic == kind)
        .map(|(_, name)| *name)
}

/// Whether the existing file at `path` is a mount point: on another device
/// than its directory (a file bind-mounted from another file system), or
/// named as a mount point in `/proc/self/mountinfo` (a bind mount within one
/// file system, which keeps the device).
fn is_mount_point(path: &Path) -> bool {
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if let (Some(file), Some(dir)) = (dev(&real), real.parent().and_then(dev))
        && file != dir
    {
        return true;
    }
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| mounted_on(&text, &real))
        .unwrap_or(false)
}

/// Whether `/proc/self/mountinfo` text names `path` as a mount point (its
/// fifth field, with spaces, tabs, newlines and backslashes octal-escaped).
fn mounted_on(mountinfo: &str, path: &Path) -> bool {
    let want = path.as_os_str().as_bytes();
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| unescape_octal(point) == want)
}

fn unescape_octal(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = (bytes[i] == b'\\')
            .then(|| bytes.get(i + 1..i + 4))
            .flatten()
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let value = d.iter().fold(0_u32, |n, c| n * 8 + u32::from(c - b'0'));
                u8::try_from(value).ok()
            });
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

fn writable(path: &Path) -> bool {
    CString::new(path.as_os_str().as_bytes())
        // SAFETY: a NUL-terminated path; access has no other effect.
        .map(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0)
        .unwrap_or(false)
}

/// Options every connection of the lock file uses: durable commits, the
/// busy timeout, no foreign-key pragma (we have no foreign keys). Each
/// connection, once open, also gets [`no_checkpoint_on_close`].
pub(crate) fn options(path: &Path, timeout: Duration) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .foreign_keys(false)
        .busy_timeout(timeout)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
        .disable_statement_logging()
}

/// Keeps `conn` from checkpointing the write-ahead log into the database
/// file and deleting the `-wal` and `-shm` when it closes as the last
/// connection (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`). A client whose lock file
/// was replaced under it (a backup copied over it, see `files.rs`) still
/// has the old log open: checkpointing it would write old pages into the
/// restored file. Nothing is lost: the log is checkpointed as it grows, and
/// the next connection reads whatever is left in it.
///
/// # Errors
/// When the connection's worker is gone.
pub(crate) async fn no_checkpoint_on_close(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle();
    // SAFETY: a valid open handle, locked for this call; this op takes an
    // int (1: on) and an int pointer for the old value (none wanted).
    let rc = unsafe {
        libsqlite3_sys::sqlite3_db_config(
            db.as_ptr(),
            libsqlite3_sys::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            1 as libc::c_int,
            std::ptr::null_mut::<libc::c_int>(),
        )
    };
    if rc == libsqlite3_sys::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "sqlite3_db_config(NO_CKPT_ON_CLOSE) returned {rc}"
        )))
    }
}

/// Looks at an existing, non-empty file without writing to it: is it a
/// SQLite database, and if so, ours or empty?
///
/// # Errors
/// [`LockError::InvalidConfig`] for anything else.
pub(crate) async fn check_existing(path: &Path, timeout: Duration) -> Result<(), LockError> {
    let size = match std::fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(error::io(&format!("cannot read {}", shown(path)), e)),
    };
    if size == 0 {
        return Ok(());
    }
    let not_ours = |why: String| {
        LockError::config(format!(
            "{} {why}; distlock keeps its locks in a file of its own and leaves this one untouched",
            shown(path)
        ))
    };
    let mut conn = options(path, timeout)
        .read_only(true)
        .connect()
        .await
        .map_err(|e| match error::primary_code(&e) {
            Some(code::NOTADB) => not_ours("is not a SQLite database".to_owned()),
            _ => not_ours(format!("cannot be opened as a SQLite database ({e})")),
        })?;
    if let Err(e) = no_checkpoint_on_close(&mut conn).await {
        let _ = conn.close().await;
        return Err(error::map(e));
    }
    // One read transaction, so the three reads see one snapshot: another
    // process creating the schema in between must not make the file look
    // half ours (tables, but no application id yet).
    let looked = match sqlx::Connection::begin(&mut conn).await {
        Ok(mut tx) => {
            let looked = look(&mut tx).await;
            let _ = tx.rollback().await;
            looked
        }
        Err(e) => Err(e),
    };
    let _ = conn.close().await;
    match looked {
        Ok((app, version, _)) if app == keys::APPLICATION_ID => {
            if version > keys::SCHEMA_VERSION {
                return Err(super::schema::newer(path, version));
            }
            Ok(())
        }
        Ok((0, _, tables)) if tables.is_empty() => Ok(()),
        Ok((app, _, tables)) => Err(not_ours(format!(
            "is a SQLite database of another program (application_id {app:#x}, tables {})",
            if tables.is_empty() {
                "none".to_owned()
            } else {
                tables.join(", ")
            }
        ))),
        Err(e) if error::primary_code(&e) == Some(code::NOTADB) => {
            Err(not_ours("is not a SQLite database".to_owned()))
        }
        Err(e) => Err(not_ours(format!(
            "cannot be read as a SQLite database ({e})"
        ))),
    }
}

/// The application id, schema version and first tables of a database.
async fn look(conn: &mut SqliteConnection) -> Result<(i64, i64, Vec<String>), sqlx::Error> {
    let app: i64 = sqlx::query_scalar("PRAGMA application_id")
        .fetch_one(&mut *conn)
        .await?;
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *conn)
        .await?;
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_schema ORDER BY name LIMIT 5")
            .fetch_all(&mut *conn)
            .await?;
    Ok((app, version, tables))
}

/// Puts the file in WAL mode and creates the schema if it is empty (or
/// upgrades an older one, `schema.rs`); refuses if it cannot be in WAL or
/// commits are not durable.
///
/// # Errors
/// [`LockError::InvalidConfig`] when the file cannot be made ours, the
/// store error otherwise.
pub(crate) async fn prepare(pool: &SqlitePool, path: &Path) -> Result<(), LockError> {
    let mut conn = pool.acquire().await.map_err(error::map)?;
    // Changing the journal mode needs a lock busy_timeout does not wait for:
    // retry while another process is between two statements.
    let mut tries = 0;
    let mode: String = loop {
        match sqlx::query_scalar("PRAGMA journal_mode = WAL")
            .fetch_one(&mut *conn)
            .await
        {
            Ok(mode) => break mode,
            Err(e) if error::primary_code(&e) == Some(code::BUSY) && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) if error::primary_code(&e) == Some(code::READONLY) => {
                return Err(LockError::config_caused_by(
                    format!(
                        "{} is read-only: distlock writes every grant to it",
                        shown(path)
                    ),
                    e,
                ));
            }
            Err(e) => return Err(error::map(e)),
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(LockError::config(format!(
            "{} cannot be put in WAL mode (SQLite says {mode:?}): without it a reader could block \
             every writer and commits would not be durable the way this backend relies on",
            shown(path)
        )));
    }
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .map_err(error::map)?;
    if sync < 2 {
        return Err(LockError::config(format!(
            "synchronous={sync} on {}: fences need synchronous=FULL to survive a power loss",
            shown(path)
        )));
    }
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(error::map)?;
    super::schema::create_or_upgrade(&mut tx, path).await?;
    tx.commit().await.map_err(error::map)?;
    Ok(())
}

/// A pool of `size` connections to the lock file.
pub(crate) async fn pool(
    path: &Path,
    timeout: Duration,
    size: u32,
) -> Result<SqlitePool, LockError> {
    SqlitePoolOptions::new()
        .max_connections(size)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(timeout)
        .after_connect(|conn, _| Box::pin(no_checkpoint_on_close(conn)))
        .after_release(|conn, _| Box::pin(outside_transactions(conn)))
        .connect_with(options(path, timeout))
        .await
        .map_err(|e| match error::primary_code(&e) {
            Some(code::CANTOPEN) => {
                LockError::config_caused_by(format!("cannot open the lock file {}", shown(path)), e)
            }
            _ => error::map(e),
        })
}

/// Whether a connection given back to its pool is outside any transaction
/// (else the pool closes it, which rolls the transaction back). A `BEGIN
/// IMMEDIATE` whose future is dropped just after the statement ran, before
/// its reply was read, leaves its connection inside a transaction that no
/// `Transaction` owns: reused, it would hold the file's write lock and
/// refuse every later `BEGIN`. The ping first lets a rollback queued by a
/// dropped `Transaction` run.
async fn outside_transactions(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    conn.ping().await?;
    Ok(<Sqlite as sqlx::Database>::TransactionManager::get_transaction_depth(conn) == 0)
}

/// Creates the lock file with mode 0600 if it does not exist, so SQLite
/// (which would use 0644) and its journal files, which copy the database's
/// mode, stay private to this user.
pub(crate) fn create_private(path: &Path) -> Result<(), LockError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(LockError::config_caused_by(
            format!("cannot create the lock file {}", shown(path)),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_with_their_escapes() {
        let mountinfo = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
45 22 8:1 /srv/a /data/my\\040locks.db rw,relatime - ext4 /dev/sda1 rw
46 22 8:1 /srv/b /data/back\\134slash rw - ext4 /dev/sda1 rw
";
        assert!(mounted_on(mountinfo, Path::new("/data/my locks.db")));
        assert!(mounted_on(mountinfo, Path::new("/data/back\\slash")));
        assert!(!mounted_on(mountinfo, Path::new("/data/my\\040locks.db")));
        assert!(!mounted_on(mountinfo, Path::new("/data")));
        assert_eq!(unescape_octal("a\\9\\777\\"), b"a\\9\\777\\");
    }
}
