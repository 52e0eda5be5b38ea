//! Restoring the lock file from an older backup moves the fence counter
//! back; the procedure (raise the fence floor to the highest fence the
//! resources saw, before clients take locks again) makes every fence handed
//! out afterwards larger again, for used and never-used names.

use std::path::Path;
use std::time::Duration;

use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{FencingToken, LockBackend, LockName};
use sqlx::Connection;

fn url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

fn name(n: &str) -> LockName {
    LockName::new(n).unwrap()
}

/// `n` acquire/release cycles of `lock`; the last fence.
async fn cycles(backend: &SqliteBackend, lock: &LockName, n: usize) -> FencingToken {
    let mut last = None;
    for _ in 0..n {
        let lease = backend
            .try_acquire_for(lock, Duration::from_secs(60))
            .await
            .unwrap()
            .into_lease()
            .expect("a free lock");
        last = Some(lease.fence());
        backend.release(&lease).await.unwrap();
    }
    last.expect("at least one cycle")
}

/// Puts `backup` in place of the lock file at `path`, as an operator does
/// with every client stopped.
fn restore(backup: &Path, path: &Path) {
    for suffix in ["-wal", "-shm"] {
        let side = path.with_file_name(format!(
            "{}{suffix}",
            path.file_name().unwrap().to_string_lossy()
        ));
        let _ = std::fs::remove_file(side);
    }
    std::fs::copy(backup, path).expect("copy the backup over the lock file");
}

#[tokio::test]
async fn a_restored_backup_repeats_fences_unless_the_floor_is_raised() {
    let dir = tempfile::tempdir().unwrap();
    let (path, backup) = (dir.path().join("locks.db"), dir.path().join("backup.db"));
    let lock = name("restored");

    let before = SqliteBackend::connect(&url(&path)).await.unwrap();
    cycles(&before, &lock, 3).await;
    // An online backup, the way an operator takes one.
    let mut conn = sqlx::SqliteConnection::connect(&url(&path)).await.unwrap();
    sqlx::query("VACUUM INTO ?")
        .bind(backup.to_string_lossy().into_owned())
        .execute(&mut conn)
        .await
        .expect("VACUUM INTO the backup");
    conn.close().await.unwrap();
    // History the restore loses: the resource saw these fences.
    let highest = cycles(&before, &lock, 5).await;
    before.close().await.unwrap();

    restore(&backup, &path);
    // Without the procedure, the next fence goes back: a fenced resource
    // would refuse the new holder, or take it for a newer one if it forgot.
    let careless = SqliteBackend::connect(&url(&path)).await.unwrap();
    let back = cycles(&careless, &lock, 1).await;
    assert!(
        back <= highest,
        "the restore did not move fences back ({back} after {highest}): the test shows nothing"
    );
    careless.close().await.unwrap();

    // The procedure: restore again, raise the floor to the highest fence
    // seen, then let clients in.
    restore(&backup, &path);
    let operator = SqliteBackend::connect(&url(&path)).await.unwrap();
    operator.raise_fence_floor(highest).await.unwrap();
    operator.close().await.unwrap();
    let client = SqliteBackend::connect(&url(&path)).await.unwrap();
    let again = cycles(&client, &lock, 1).await;
    let fresh = cycles(&client, &name("never-used"), 1).await;
    assert!(again > highest, "{again} after a floor of {highest}");
    assert!(fresh > highest, "{fresh} after a floor of {highest}");
    // A lower floor moves nothing back.
    client
        .raise_fence_floor(FencingToken::new(1).unwrap())
        .await
        .unwrap();
    assert!(cycles(&client, &lock, 1).await > again);
    client.close().await.unwrap();
}
