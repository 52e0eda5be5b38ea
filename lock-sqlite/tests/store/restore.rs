//! Restoring the lock file from an older backup moves the fence counter
//! back; the procedure (raise the fence floor to the highest fence the
//! resources saw, before clients take locks again) makes every fence handed
//! out afterwards larger again, for used and never-used names. It runs in
//! one process (close, copy, reconnect) without a file error, and a client
//! left running across it (against the procedure) never makes a second
//! holder nor a repeated fence: it notices its files were replaced and
//! closes itself, and until it does nobody can connect.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_conformance::kit::scaled;
use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{FencingToken, LockBackend, LockError, LockName};
use sqlx::Connection;
use tokio::time::Instant;

use crate::support::{self, name};

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

/// An online backup of the lock file at `path`, the way an operator takes one.
async fn backup(path: &Path, to: &Path) {
    let mut conn = sqlx::SqliteConnection::connect(&support::url(path))
        .await
        .unwrap();
    sqlx::query("VACUUM INTO ?")
        .bind(to.to_string_lossy().into_owned())
        .execute(&mut conn)
        .await
        .expect("VACUUM INTO the backup");
    conn.close().await.unwrap();
}

/// Puts `backup` in place of the lock file at `path`, as docs/operations.md
/// says (with every client stopped): its `-wal` and `-shm` removed, the
/// backup copied over it.
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

    let before = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    cycles(&before, &lock, 3).await;
    // An online backup, the way an operator takes one.
    let mut conn = sqlx::SqliteConnection::connect(&support::url(&path))
        .await
        .unwrap();
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
    let careless = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    let back = cycles(&careless, &lock, 1).await;
    assert!(
        back <= highest,
        "the restore did not move fences back ({back} after {highest}): the test shows nothing"
    );
    careless.close().await.unwrap();

    // The procedure: restore again, raise the floor to the highest fence
    // seen, then let clients in.
    restore(&backup, &path);
    let operator = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    operator.raise_fence_floor(highest).await.unwrap();
    operator.close().await.unwrap();
    let client = SqliteBackend::connect(&support::url(&path)).await.unwrap();
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

/// docs/operations.md's procedure, in one process and 20 times over: close
/// the client, copy the backup over the file, reconnect, raise the floor,
/// take locks. Before `close` waited for every connection to close, a
/// connection left open saw the file change under it: "disk I/O error"
/// (code 522), then "file is not a database".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restore_procedure_runs_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let (path, saved) = (dir.path().join("locks.db"), dir.path().join("backup.db"));
    let lock = name("restored-in-process");
    let mut highest = 0;
    for round in 0..20 {
        let client = SqliteBackend::connect(&support::url(&path)).await.unwrap();
        cycles(&client, &lock, 2).await;
        let _ = std::fs::remove_file(&saved);
        backup(&path, &saved).await;
        highest = cycles(&client, &lock, 3).await.get().max(highest);
        client.close().await.unwrap();

        restore(&saved, &path);
        let client = SqliteBackend::connect(&support::url(&path))
            .await
            .unwrap_or_else(|e| panic!("round {round}: reconnecting after the restore: {e}"));
        client
            .raise_fence_floor(FencingToken::new(highest).unwrap())
            .await
            .unwrap_or_else(|e| panic!("round {round}: raising the floor: {e}"));
        for lock in [&lock, &name("never-used")] {
            let next = cycles(&client, lock, 2).await;
            assert!(
                next.get() > highest,
                "round {round}: {next} after {highest}"
            );
            highest = next.get();
        }
        client.close().await.unwrap();
    }
}

/// A holder left running across a restore (the procedure says to stop
/// every client; this one was not), renewing as usual: no second holder
/// and no repeated fence. Until it notices, the operator cannot connect to
/// the restored file: refused (the holder's grant is beyond the file's
/// counter), or held up by the holder's lock on the file (a backup in
/// rollback mode, as `VACUUM INTO` writes it, is put back in WAL mode, which
/// SQLite does only with the file to itself). The holder notices at
/// its next renewal (its files are not the ones it opened), loses its lease
/// and closes itself; then the operator raises the floor and every fence
/// granted is above every fence seen before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_left_running_across_a_restore_makes_no_second_holder() {
    for backup_in_wal_mode in [false, true] {
        left_running_across_a_restore(backup_in_wal_mode).await;
    }
}

async fn left_running_across_a_restore(backup_in_wal_mode: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (path, saved) = (dir.path().join("locks.db"), dir.path().join("backup.db"));
    let lock = name("live");
    // Renewed every TTL/3: that long, the holder has not noticed yet.
    let ttl = scaled(Duration::from_secs(6));
    let before = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    cycles(&before, &lock, 3).await;
    backup(&path, &saved).await;
    if backup_in_wal_mode {
        // As sqlite3's `.backup` leaves it.
        let mut conn = sqlx::SqliteConnection::connect(&support::url(&saved))
            .await
            .unwrap();
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
    }
    let mut highest = cycles(&before, &lock, 3).await.get();
    before.close().await.unwrap();

    let mut holder = support::helper(
        &path,
        &format!("hold-renewing {} {}", lock.as_str(), ttl.as_millis()),
    )
    .unwrap();
    let held: u64 = support::expect_line(&mut holder, "held")
        .unwrap()
        .rsplit(' ')
        .next()
        .and_then(|f| f.parse().ok())
        .expect("the holder's fence");
    assert!(held > highest);
    highest = held;

    restore(&saved, &path);
    let restored = Instant::now();
    let mut refused = Vec::new();
    // The holder notices at its first renewal, TTL/3 after its grant, and
    // must before its TTL ends: each connect is cut at that deadline, so a
    // holder that never notices (a connect kept waiting on it) fails here.
    let noticed_by = restored + ttl;
    let (operator, let_in) = loop {
        let connected = tokio::time::timeout_at(
            noticed_by,
            SqliteBackend::connect(&support::url(&path)),
        )
        .await
        .unwrap_or_else(|_| {
            panic!("the holder did not notice the restore within its TTL ({ttl:?}): still no client connects")
        });
        match connected {
            Ok(operator) => break (operator, support::monotonic_ns()),
            Err(e @ LockError::Unavailable { .. })
                if e.to_string().contains(&format!("still holds grant {held}"))
                    || e.to_string().contains("database is locked") =>
            {
                refused.push(e.to_string());
                assert!(
                    restored.elapsed() < ttl,
                    "the holder never noticed the restore: {e}"
                );
            }
            Err(e) => panic!("connecting to the restored file: {e}"),
        }
    };
    // The operator got in only once the holder had let go of its grant's
    // presence file (and of its connections), which it does only after its
    // lease's loss fired (`a_replaced_file_loses_each_lease_before_letting_go`).
    assert!(
        !presence_held(&path, held),
        "the operator got in while the holder still held grant {held}"
    );
    let lost = support::expect_line(&mut holder, "lost").unwrap();
    assert!(lost.contains("held=false"), "{lost}");
    let lost_at: u128 = lost
        .rsplit("at=")
        .next()
        .and_then(|t| t.parse().ok())
        .expect("when the holder saw its loss");
    eprintln!(
        "backup in WAL mode: {backup_in_wal_mode}; the operator was let in after {:?}, refused \
         {} times before ({:?}); the holder's lost() ran {:?} before (or after: -) that",
        restored.elapsed(),
        refused.len(),
        refused.first(),
        if lost_at <= let_in {
            format!("{:?}", Duration::from_nanos((let_in - lost_at) as u64))
        } else {
            format!("-{:?}", Duration::from_nanos((lost_at - let_in) as u64))
        }
    );
    operator
        .raise_fence_floor(FencingToken::new(highest).unwrap())
        .await
        .unwrap();
    let clients = [
        operator,
        SqliteBackend::connect(&support::url(&path)).await.unwrap(),
    ];
    for client in &clients {
        for lock in [&lock, &name("never-used")] {
            let next = cycles(client, lock, 2).await;
            assert!(next.get() > highest, "{next} after {highest}");
            highest = next.get();
        }
    }
    for client in clients {
        client.close().await.unwrap();
    }
}

/// Whether some process holds the `flock` of the presence file of grant
/// `fence` of the lock file at `path`.
fn presence_held(path: &Path, fence: u64) -> bool {
    use std::os::fd::AsRawFd;
    let dir = format!("{}-distlock", path.display());
    std::fs::File::open(Path::new(&dir).join(fence.to_string())).is_ok_and(|file| {
        // SAFETY: flock on a descriptor we own; closing it releases ours.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
    })
}

/// When a client finds its files replaced, each lease's loss fires before
/// its presence file lets go, and so before any other process may take
/// the name (which needs that `flock`, or the client's connections gone):
/// a thread that takes the `flock` the moment it is free finds the loss
/// already fired, 20 times over. And it lets go before it answers the call
/// that found out: a file still held once the call was answered fails the
/// round at once (no wait for a let-go that never comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_file_loses_each_lease_before_letting_go() {
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let client = SqliteBackend::connect(&support::url(&path)).await.unwrap();
        let lease = client
            .try_acquire_for(&name("let-go"), Duration::from_secs(60))
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        let fence = lease.fence().get();
        assert!(presence_held(&path, fence));
        let signal = lease.loss_signal().expect("a loss signal").clone();
        // Set once the renewal below is answered.
        let answered = Arc::new(AtomicBool::new(false));
        // Whether the loss had fired when the file was first seen free;
        // `None`: still held after the answer.
        let watcher = std::thread::spawn({
            let (path, answered) = (path.clone(), answered.clone());
            move || {
                loop {
                    let after_answer = answered.load(Ordering::SeqCst);
                    if !presence_held(&path, fence) {
                        return Some(signal.is_cancelled());
                    }
                    if after_answer {
                        return None;
                    }
                    std::hint::spin_loop();
                }
            }
        });
        std::fs::remove_file(format!("{}-wal", path.display())).unwrap();
        let refused = client.renew(&lease).await;
        answered.store(true, Ordering::SeqCst);
        assert!(
            matches!(&refused, Err(e @ LockError::Unavailable { .. }) if e.to_string().contains("was replaced")),
            "{refused:?}"
        );
        match watcher.join().unwrap() {
            Some(lost_first) => assert!(
                lost_first,
                "round {round}: the presence file was free before the lease's loss fired"
            ),
            None => panic!(
                "round {round}: the client refused the renewal with the presence file still held"
            ),
        }
        client.close().await.unwrap();
    }
}

/// Without replacing the files, a fence counter moved back under a live
/// holder (what a restore does to the table) grants nothing twice: not the
/// holder's fence to another name (its presence file is held), and no new
/// client connects while the holder holds a grant beyond the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_held_beyond_a_counter_moved_back_is_never_granted_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let holder = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    let held = holder
        .try_acquire_for(&name("held"), Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&support::url(&path))
        .await
        .unwrap();
    sqlx::query("UPDATE distlock_fence SET last = ?1")
        .bind(held.fence().get() as i64 - 1)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let repeated = holder
        .try_acquire_for(&name("other"), Duration::from_secs(60))
        .await;
    assert!(
        matches!(&repeated, Err(e @ LockError::Store { .. }) if e.to_string().contains("already held by a live process")),
        "{repeated:?}"
    );
    let newcomer = SqliteBackend::connect(&support::url(&path)).await;
    assert!(
        matches!(&newcomer, Err(e @ LockError::Unavailable { .. }) if e.to_string().contains("beyond the file's fence counter")),
        "{newcomer:?}"
    );
    holder.release(&held).await.unwrap();
    let newcomer = SqliteBackend::connect(&support::url(&path)).await.unwrap();
    newcomer.close().await.unwrap();
    holder.close().await.unwrap();
}
