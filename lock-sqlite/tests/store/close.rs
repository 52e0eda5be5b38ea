//! Closing a client: `close` returns once every connection, file and task
//! of it is closed (this process's `/proc/self/fd` shows none of the lock
//! file's, its `-wal`, `-shm` or presence files, nor its inotify instance);
//! every lease it granted is lost first, and what it held is free at once;
//! an acquire cut short, or a waiter that gave up, leaves nothing behind
//! once its client is closed; a dropped client keeps its leases to their
//! deadlines. The descriptors counted are those of the test's own temp dir
//! and its own client's inotify instance: other tests of the binary may
//! open and close theirs meanwhile.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::scaled;
use lock_sqlite::SqliteBackend;
use lockcore::backend::LockBackendExt;
use lockcore::{
    Attempt, Lease, LockBackend, LockError, LockName, Locker, LossReason, ReleaseOutcome,
};
use sqlx::Connection;

use crate::support::{self, inotify_watching, name, watch_id};

/// What this process's descriptors point at.
fn open_files() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| {
            let link = std::fs::read_link(entry.ok()?.path()).ok()?;
            Some(link.to_string_lossy().into_owned())
        })
        .collect()
}

/// This process's descriptors under `dir` (deleted files included).
fn open_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    open_files()
        .into_iter()
        .filter(|f| f.starts_with(&dir))
        .collect()
}

/// Marks the client's inotify instance (the one that watches `held`, a
/// presence file of its grant) with a watch of the test's own on `dir`,
/// which outlives the client: as long as that instance is open, and only
/// then, some instance of this process watches `dir`. The client never
/// removes a watch it did not add, and ignores its events.
fn mark_instance(held: &Path, dir: &Path) {
    let ours = inotify_watching(watch_id(held));
    assert_eq!(
        ours.len(),
        1,
        "one instance watches the holder's file: {ours:?}"
    );
    let dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; the descriptor is the client's open instance.
    let wd = unsafe { libc::inotify_add_watch(ours[0], dir.as_ptr(), libc::IN_DELETE_SELF) };
    assert!(wd >= 0, "{}", std::io::Error::last_os_error());
}

/// Rows of the lock table, as the file itself has them.
async fn rows(path: &Path) -> Vec<(String, i64)> {
    let mut conn = sqlx::SqliteConnection::connect(&support::url(path))
        .await
        .unwrap();
    let rows = sqlx::query_as("SELECT name, fence FROM distlock_leases ORDER BY fence")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    rows
}

async fn take(backend: &SqliteBackend, lock: &LockName) -> Lease {
    backend
        .try_acquire_for(lock, Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .expect("a free lock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_returns_once_every_file_of_the_client_is_closed() {
    const ROUNDS: usize = 25;
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let backend = SqliteBackend::connect(&support::url(&path)).await.unwrap();
        let locker = Locker::new(backend.clone()).ttl(Duration::from_secs(30));
        // Use every part: both pools, presence files, watches of holders
        // and of waiters, a renewal, a release, a permit.
        // Free names: granted at the first attempt (a grant that never
        // comes fails the round at once instead of after a 30 s wait).
        let kept = locker
            .try_acquire("kept")
            .await
            .unwrap()
            .expect("a free name");
        let presence = dir.path().join("locks.db-distlock");
        mark_instance(
            &presence.join(kept.fencing_token().get().to_string()),
            dir.path(),
        );
        let released = (locker.try_acquire("released").await.unwrap()).expect("a free name");
        let permits = locker.semaphore("permits", 2).unwrap();
        let permit = permits.try_acquire().await.unwrap().expect("a free permit");
        let waiting = tokio::time::timeout(Duration::from_millis(30), locker.acquire("kept")).await;
        assert!(waiting.is_err(), "the name is held");
        backend.inspect(&name("kept")).await.unwrap().unwrap();
        let direct = take(&backend, &name("direct")).await;
        backend.renew(&direct).await.unwrap();
        released.release().await.unwrap();
        if round % 2 == 0 {
            locker.close().await.unwrap();
        } else {
            backend.close().await.unwrap();
        }
        let open = open_under(dir.path());
        assert!(
            open.is_empty(),
            "round {round}: still open right after close returned: {open:?}"
        );
        assert_eq!(
            inotify_watching(watch_id(dir.path())),
            Vec::<i32>::new(),
            "round {round}: the client's inotify instance is still open"
        );
        assert!(!kept.is_held() && !permit.is_held());
        assert!(
            direct.is_expired(),
            "round {round}: a direct lease reads held"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_loses_every_lease_first_and_frees_it_at_once() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    let (a, b) = (
        SqliteBackend::connect(&url).await.unwrap(),
        SqliteBackend::connect(&url).await.unwrap(),
    );
    let lock = take(&a, &name("closing")).await;
    let permit = a
        .try_acquire_permit(
            &lockcore::backend::LockRequest::new(
                name("closing-permits"),
                a.capabilities()
                    .effective_ttl(Duration::from_secs(60))
                    .unwrap(),
            ),
            1,
        )
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    a.clone().close().await.unwrap();
    for lease in [&lock, &permit] {
        assert!(
            lease.loss_signal().is_some_and(|s| s.is_cancelled()),
            "{}: the loss signal did not fire at close",
            lease.name()
        );
        assert!(lease.is_expired());
    }
    // Released, not only let go: the file has no row of them.
    assert_eq!(rows(file.path()).await, vec![]);
    assert!(b.inspect(&name("closing")).await.unwrap().is_none());
    let next = take(&b, &name("closing")).await;
    assert!(next.fence() > permit.fence());
    b.release(&next).await.unwrap();
    // Closed: refused, saying so (retry on another client), before any I/O;
    // closing again is harmless.
    for refused in [
        a.try_acquire_for(&name("after"), Duration::from_secs(1))
            .await
            .map(drop),
        a.release(&lock).await.map(drop),
        a.inspect(&name("after")).await.map(drop),
        a.renew(&lock).await.map(drop),
        a.raise_fence_floor(lockcore::FencingToken::new(5).unwrap())
            .await,
    ] {
        assert!(
            matches!(&refused, Err(e @ LockError::Unavailable { .. }) if e.to_string().contains("was closed")),
            "{refused:?}"
        );
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A dropped client does not free what it granted (a lease outlives its
/// backend to its deadline): its leases keep reading held, and are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_keeps_its_leases_to_their_deadline() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    let a = SqliteBackend::connect(&url).await.unwrap();
    let lease = take(&a, &name("dropped")).await;
    drop(a);
    let b = SqliteBackend::connect(&url).await.unwrap();
    assert!(!lease.is_expired());
    let holder = b.inspect(&name("dropped")).await.unwrap();
    assert_eq!(holder.map(|h| h.fence), Some(lease.fence()));
    assert!(matches!(
        b.try_acquire_for(&name("dropped"), Duration::from_secs(1))
            .await
            .unwrap(),
        Attempt::Held { .. }
    ));
    // The lease still releases through another client of the file.
    assert_eq!(b.release(&lease).await.unwrap(), ReleaseOutcome::Released);
    b.close().await.unwrap();
}

/// A waiter that timed out, its client closed right away (a process that
/// exits after a failed `distlock run --wait`), leaves nothing: once the
/// holder releases, the file has no row and another client takes the name
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_closed_at_once_leaves_nothing() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    let holder = SqliteBackend::connect(&url).await.unwrap();
    let lock = name("waited-for");
    let lease = take(&holder, &lock).await;
    for i in 0..10_u64 {
        let waiter =
            Locker::new(SqliteBackend::connect(&url).await.unwrap()).ttl(Duration::from_secs(60));
        let outcome = waiter
            .acquire_timeout(&lock, Duration::from_millis(10 + 3 * i))
            .await;
        assert!(
            matches!(outcome, Err(LockError::Timeout { .. })),
            "{outcome:?}"
        );
        waiter.close().await.unwrap();
    }
    assert_eq!(
        rows(file.path()).await,
        vec![(lock.as_str().to_owned(), lease.fence().get() as i64)]
    );
    holder.release(&lease).await.unwrap();
    assert_eq!(rows(file.path()).await, vec![]);
    let other = SqliteBackend::connect(&url).await.unwrap();
    let next = take(&other, &lock).await;
    other.release(&next).await.unwrap();
    other.close().await.unwrap();
    holder.close().await.unwrap();
}

/// An acquire cut short at every point of its transaction (a timeout, a
/// dropped future), its client closed at once, leaves no row: one granted
/// is released by the close, one whose commit was under way when it was
/// dropped is undone by a clean-up that the close finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cut_short_anywhere_leaves_nothing_once_closed() {
    let file = support::SqliteFactory::fresh();
    let url = support::url(file.path());
    // How long a whole acquire takes here, to cut it at every point of it.
    let probe = SqliteBackend::connect(&url).await.unwrap();
    let started = std::time::Instant::now();
    let lease = take(&probe, &name("probe")).await;
    let whole = started.elapsed();
    probe.release(&lease).await.unwrap();
    probe.close().await.unwrap();
    let steps = 60_u32;
    let (mut granted, mut cut) = (0, 0);
    for step in 0..=steps {
        let client = Arc::new(SqliteBackend::connect(&url).await.unwrap());
        let lock = name(&format!("cut-{step}"));
        let at = scaled(whole) * 2 * step / steps;
        match tokio::time::timeout(at, client.try_acquire_for(&lock, Duration::from_secs(60))).await
        {
            Ok(attempt) => {
                attempt.unwrap().into_lease().expect("a free lock");
                granted += 1;
            }
            Err(_) => cut += 1,
        }
        client.close().await.unwrap();
        let left = rows(file.path()).await;
        assert!(
            left.is_empty(),
            "step {step} (cut after {at:?}): rows left after close: {left:?}"
        );
    }
    eprintln!("{granted} acquires completed, {cut} cut short; none left a row");
    assert!(
        cut > 0 && granted > 0,
        "the steps never cut an acquire short, or always did"
    );
}

/// Acquires cut short at every point of their transaction leave the
/// client usable: a `BEGIN IMMEDIATE` that ran but whose reply was never
/// read leaves its pooled connection inside a transaction, which must not
/// be handed out again (it would hold the file's write lock, and every
/// later `BEGIN` on it fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_cut_short_anywhere_leave_the_client_usable() {
    let file = support::SqliteFactory::fresh();
    let client = SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let lease = take(&client, &name("probe")).await;
    let whole = started.elapsed();
    client.release(&lease).await.unwrap();
    // The BEGIN's reply comes early in an acquire: cut finely there.
    let steps = 1000_u32;
    for step in 0..=steps {
        let at = scaled(whole) * step / steps / 4;
        let lock = name(&format!("cut-{step}"));
        let cut = tokio::time::timeout(at, client.try_acquire_for(&lock, Duration::from_secs(60)));
        if let Ok(attempt) = cut.await {
            attempt.unwrap().into_lease().expect("a free lock");
        }
        let next = client
            .try_acquire_for(&name(&format!("next-{step}")), Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("step {step} (cut after {at:?}): the next acquire: {e}"));
        client
            .release(&next.into_lease().expect("a free lock"))
            .await
            .unwrap();
    }
    client.close().await.unwrap();
}

/// The guard's view of a close through its `Locker`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reads_closed_after_its_locker_closed() {
    let file = support::SqliteFactory::fresh();
    let locker = Locker::new(
        SqliteBackend::connect(&support::url(file.path()))
            .await
            .unwrap(),
    );
    let guard = locker
        .try_acquire("guarded")
        .await
        .unwrap()
        .expect("a free name");
    locker.close().await.unwrap();
    assert!(!guard.is_held());
    assert_eq!(guard.loss_reason(), Some(LossReason::Closed));
    assert_eq!(rows(file.path()).await, vec![]);
}
