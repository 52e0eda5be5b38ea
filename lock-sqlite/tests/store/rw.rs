//! Reader-writer locks on the lock file: each holder a row of its own
//! (`kind = 'rw'`, slot = its fence, its access) with its presence file, a
//! waiting writer's intent a row (`kind = 'intent'`) with a presence file
//! of its own; a dead reader or writer (`kill -9`) frees the name at once,
//! a stopped writer's intent lapses within its TTL, a writer that gives up
//! leaves nothing, waiters are woken by the kernel, fences come from the
//! file's one counter, above its floor, and a cut-short attempt leaves
//! nothing once its client is closed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::scaled;
use lock_sqlite::SqliteBackend;
use lockcore::backend::wait::WaitPolicy;
use lockcore::backend::{Kind, LockBackendExt, LockRequest, Moment};
use lockcore::{
    Access, FencingToken, HolderLabel, Lease, LockBackend, LockError, LockName, Locker,
    ReleaseOutcome,
};
use sqlx::Connection;
use tokio::time::Instant;

use crate::presence::{locked, presence};
use crate::support::{self, expect_line, name};

const LONG: Duration = Duration::from_secs(60);

async fn connect(file: &support::SqliteFactory) -> SqliteBackend {
    SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap()
}

fn request(b: &SqliteBackend, n: &LockName, access: Access, ttl: Duration) -> LockRequest {
    let ttl = b.capabilities().effective_ttl(ttl).unwrap();
    LockRequest::new(n.clone(), ttl)
        .with_label(HolderLabel::new(format!("{access}er")).unwrap())
        .with_access(access)
}

async fn try_take(b: &SqliteBackend, n: &LockName, access: Access) -> Option<Lease> {
    let attempt = b.try_acquire(&request(b, n, access, LONG)).await.unwrap();
    attempt.into_lease()
}

async fn take(b: &SqliteBackend, n: &LockName, access: Access) -> Lease {
    (try_take(b, n, access).await).unwrap_or_else(|| panic!("the {access} of {n} was refused"))
}

/// The rows of reader-writer lock `n` (holders and intents) as the file
/// has them: `(kind, slot, fence, access)`.
async fn rows(path: &Path, n: &LockName) -> Vec<(String, i64, i64, Option<String>)> {
    let mut conn = sqlx::SqliteConnection::connect(&support::url(path))
        .await
        .unwrap();
    let rows = sqlx::query_as(
        "SELECT kind, slot, fence, access FROM distlock_leases
         WHERE kind IN ('rw', 'intent') AND name = ?1 ORDER BY fence",
    )
    .bind(n.as_str())
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    rows
}

/// The fences of `n`'s intents in the file.
async fn intents(path: &Path, n: &LockName) -> Vec<i64> {
    (rows(path, n).await.into_iter())
        .filter(|(kind, ..)| kind == "intent")
        .map(|(_, _, fence, _)| fence)
        .collect()
}

/// Waits (up to 10 s) for a writer's intent on `n`; its fence.
async fn intent_of(path: &Path, n: &LockName) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let [fence] = intents(path, n).await[..] {
            return fence;
        }
        assert!(Instant::now() < deadline, "no intent on {n} within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn fence(lease: &Lease) -> i64 {
    lease.fence().get() as i64
}

fn rw(fence: i64, access: &str) -> (String, i64, i64, Option<String>) {
    ("rw".to_owned(), fence, fence, Some(access.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_holder_is_a_row_and_a_lease_of_its_own() {
    let file = support::SqliteFactory::fresh();
    let (a, b) = (connect(&file).await, connect(&file).await);
    let n = name("rw/rows");
    let r1 = take(&a, &n, Access::Read).await;
    let r2 = take(&b, &n, Access::Read).await;
    assert_eq!(r1.access(), Some(Access::Read));
    // The lock of the same name is another namespace.
    let lock = a.try_acquire_for(&n, LONG).await.unwrap().into_lease();
    assert!(lock.is_some(), "the lock of a name read-held");
    assert_eq!(
        rows(file.path(), &n).await,
        [rw(fence(&r1), "read"), rw(fence(&r2), "read")]
    );
    assert!(locked(file.path(), fence(&r1)) && locked(file.path(), fence(&r2)));
    let holders = b.holders(&n, Kind::ReadWrite).await.unwrap();
    let seen: Vec<_> = (holders.iter())
        .map(|h| (h.fence, h.access, h.label.as_ref().unwrap().to_string()))
        .collect();
    let reader = "reader".to_owned();
    assert_eq!(
        seen,
        [
            (r1.fence(), Some(Access::Read), reader.clone()),
            (r2.fence(), Some(Access::Read), reader)
        ]
    );
    assert!(try_take(&b, &n, Access::Write).await.is_none());
    // Renewed and released on its own row: the same fence as a lock's is
    // not it.
    let forged = Lease::new(n.clone(), r1.owner(), r1.fence(), r1.ttl(), Moment::now());
    let renewed = a
        .renew_many(&[r1.clone(), r2.clone(), forged.clone()])
        .await;
    assert!(renewed[0].is_ok() && renewed[1].is_ok(), "{renewed:?}");
    assert!(matches!(renewed[2], Err(LockError::NotHeld { .. })));
    let set = a.set_remaining(&forged, r1.ttl()).await;
    assert!(matches!(set, Err(LockError::NotHeld { .. })), "{set:?}");
    assert_eq!(a.release(&forged).await.unwrap(), ReleaseOutcome::NotHeld);
    // Set to a remaining time, a share outlives its process: no flock.
    let r1 = a.set_remaining(&r1, r1.ttl()).await.unwrap();
    assert!(!locked(file.path(), fence(&r1)));
    assert_eq!(a.release(&r1).await.unwrap(), ReleaseOutcome::Released);
    assert!(!presence(file.path(), fence(&r1)).exists());
    assert!(try_take(&a, &n, Access::Write).await.is_none(), "r2 holds");
    assert_eq!(b.release(&r2).await.unwrap(), ReleaseOutcome::Released);
    let w = take(&a, &n, Access::Write).await;
    assert!(w.fence() > r2.fence());
    assert_eq!(rows(file.path(), &n).await, [rw(fence(&w), "write")]);
    assert!(try_take(&b, &n, Access::Read).await.is_none());
    assert_eq!(
        (b.holders(&n, Kind::ReadWrite).await.unwrap().iter())
            .map(|h| (h.fence, h.access))
            .collect::<Vec<_>>(),
        [(w.fence(), Some(Access::Write))]
    );
    a.release(&w).await.unwrap();
    assert_eq!(rows(file.path(), &n).await, []);
}

/// A waiting writer's intent keeps new readers out for as long as it waits,
/// far past its TTL (each attempt moves it on), and goes with its grant,
/// presence file and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_keeps_readers_out_and_its_grant_takes_its_intent() {
    let file = support::SqliteFactory::fresh();
    let (a, b) = (connect(&file).await, connect(&file).await);
    let n = name("rw/intent");
    let read = take(&a, &n, Access::Read).await;
    let ttl = scaled(Duration::from_millis(600));
    let writer = Locker::new(b).ttl(ttl).rw_lock(&n).unwrap();
    let waiting = tokio::spawn(async move { writer.write_timeout(LONG).await });
    let intent = intent_of(file.path(), &n).await;
    assert!(intent > fence(&read));
    assert!(locked(file.path(), intent), "the intent's presence file");
    for _ in 0..3 {
        assert!(
            try_take(&a, &n, Access::Read).await.is_none(),
            "a new reader"
        );
        tokio::time::sleep(ttl).await;
    }
    assert_eq!(
        intents(file.path(), &n).await,
        [intent],
        "moved on, not remade"
    );
    a.release(&read).await.unwrap();
    let write = waiting.await.unwrap().unwrap();
    assert_eq!(
        rows(file.path(), &n).await,
        [rw(fence(&write.lease()), "write")]
    );
    assert!(!presence(file.path(), intent).exists());
    write.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_process_died_frees_the_name_for_a_writer_at_once() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("rw/dead-reader");
    let mut helper = support::helper(file.path(), &format!("rw read {n} 60000")).unwrap();
    let line = tokio::task::block_in_place(|| expect_line(&mut helper, "held")).unwrap();
    let dead: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(try_take(&a, &n, Access::Write).await.is_none(), "alive");
    helper.0.kill().unwrap();
    helper.0.wait().unwrap();
    let w = try_take(&a, &n, Access::Write).await;
    let w = w.expect("the dead reader's share, with 60 s left, still counted");
    assert!(w.fence().get() > dead);
    assert!(!presence(file.path(), dead as i64).exists());
    a.release(&w).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_process_died_lets_readers_in_at_once() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("rw/dead-writer");
    let read = take(&a, &n, Access::Read).await;
    let mut helper = support::helper(file.path(), &format!("rw write {n} 60000")).unwrap();
    let intent = intent_of(file.path(), &n).await;
    assert!(try_take(&a, &n, Access::Read).await.is_none(), "it waits");
    helper.0.kill().unwrap();
    helper.0.wait().unwrap();
    let next = try_take(&a, &n, Access::Read).await;
    let next = next.expect("the dead writer's intent, with 60 s left, still counted");
    assert!(
        intents(file.path(), &n).await.is_empty(),
        "taken away with the grant"
    );
    assert!(!presence(file.path(), intent).exists());
    a.release(&next).await.unwrap();
    a.release(&read).await.unwrap();
}

/// A stopped writer (`SIGSTOP`) keeps its `flock`: its intent lapses within
/// its TTL, and the reader waiting behind it gets in then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_writers_intent_lapses_within_its_ttl() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("rw/stopped-writer");
    let read = take(&a, &n, Access::Read).await;
    let ttl = scaled(Duration::from_millis(500));
    let what = format!("rw write {n} {}", ttl.as_millis());
    let helper = support::helper(file.path(), &what).unwrap();
    intent_of(file.path(), &n).await;
    support::stop_outside_a_write(&helper.0, file.path()).await;
    let stopped = Instant::now();
    let reader = Locker::new(a.clone()).ttl(LONG).rw_lock(&n).unwrap();
    let next = reader.read_timeout(LONG).await.unwrap();
    let waited = stopped.elapsed();
    assert!(
        waited <= ttl + scaled(Duration::from_secs(1)),
        "waited {waited:?} for an intent of TTL {ttl:?}"
    );
    // SAFETY: as above.
    unsafe { libc::kill(helper.0.id() as i32, libc::SIGCONT) };
    drop(helper);
    next.release().await.unwrap();
    a.release(&read).await.unwrap();
}

/// A writer that gives up (its deadline, its future dropped) lets readers
/// in at once, and its row and presence file are gone once its client is
/// closed (the clean-up that removes them is finished by the close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_leaves_nothing() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("rw/gave-up");
    let read = take(&a, &n, Access::Read).await;
    let b = connect(&file).await;
    let writer = Locker::new(b.clone()).ttl(LONG).rw_lock(&n).unwrap();
    let timed_out = writer.write_timeout(Duration::from_millis(200)).await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    let next = try_take(&a, &n, Access::Read).await;
    a.release(&next.expect("a reader after the writer timed out"))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { writer.write().await });
    let intent = intent_of(file.path(), &n).await;
    waiting.abort();
    let _ = waiting.await;
    assert!(!locked(file.path(), intent), "let go with the dropped wait");
    b.close().await.unwrap();
    assert_eq!(rows(file.path(), &n).await, [rw(fence(&read), "read")]);
    assert!(!presence(file.path(), intent).exists());
    a.release(&read).await.unwrap();
}

/// Waiters that only the kernel can wake (re-check and backoff 30 s, TTLs
/// 60 s): a reader behind an intent is woken when its writer gives up, a
/// writer behind readers when they release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_waiters_are_woken_by_the_kernel() {
    let bound = scaled(Duration::from_secs(1));
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("rw/woken");
    let read = take(&a, &n, Access::Read).await;
    let deaf = |b: SqliteBackend| {
        Locker::new(b)
            .ttl(LONG)
            .recheck(Duration::from_secs(30))
            .backoff(lockcore::Backoff::new(
                Duration::from_secs(30),
                Duration::from_secs(30),
            ))
            .rw_lock(&n)
            .unwrap()
    };
    let (writer, reader) = (deaf(connect(&file).await), deaf(connect(&file).await));
    let waiting = tokio::spawn({
        let writer = writer.clone();
        async move { writer.write_timeout(LONG).await }
    });
    intent_of(file.path(), &n).await;
    let behind = tokio::spawn(async move { reader.read_timeout(LONG).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !behind.is_finished(),
        "a reader got in behind a waiting writer"
    );
    waiting.abort();
    let _ = waiting.await;
    let second = tokio::time::timeout(bound, behind).await;
    let second = second.expect("the reader was not woken").unwrap().unwrap();
    let waiting = tokio::spawn(async move { writer.write_timeout(LONG).await });
    intent_of(file.path(), &n).await;
    a.release(&read).await.unwrap();
    second.release().await.unwrap();
    let write = tokio::time::timeout(bound, waiting).await;
    let write = write.expect("the writer was not woken").unwrap().unwrap();
    write.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_fences_come_from_the_files_counter_above_its_floor() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("rw/floor");
    let lock = a
        .try_acquire_for(&n, LONG)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let read = take(&a, &n, Access::Read).await;
    assert!(read.fence() > lock.fence(), "one counter for every kind");
    a.release(&read).await.unwrap();
    let floor = FencingToken::new(1_000_000).unwrap();
    a.raise_fence_floor(floor).await.unwrap();
    let write = take(&a, &n, Access::Write).await;
    assert!(write.fence() > floor);
    a.release(&write).await.unwrap();
    a.release(&lock).await.unwrap();
}

/// Attempts cut short at every point (a read, a write, a writer's wait with
/// its intent), each client closed at once, leave nothing but the reader
/// the waits were behind: one granted is released by the close, one whose
/// commit was under way is undone, an intent removed, by clean-ups the
/// close finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_attempts_cut_short_anywhere_leave_nothing_once_closed() {
    let file = support::SqliteFactory::fresh();
    let holder = connect(&file).await;
    let held = name("rw/cut-held");
    let read = take(&holder, &held, Access::Read).await;
    let started = std::time::Instant::now();
    let probe = take(&holder, &name("rw/probe"), Access::Write).await;
    let whole = scaled(started.elapsed());
    holder.release(&probe).await.unwrap();
    // Step 0 is cut before its grant, the last one surely in its wait (a
    // grant takes far less than 5 s, the wait a minute); the steps between
    // sweep both (where, depends on this machine's load).
    let steps = 40_u32;
    let mut waited = 0;
    for step in 0..=steps + 1 {
        let client = Arc::new(connect(&file).await);
        let at = match step {
            s if s > steps => scaled(Duration::from_secs(5)),
            s => whole * 3 * s / steps,
        };
        let free = name(&format!("rw/cut-{step}"));
        let access = [Access::Read, Access::Write][step as usize % 2];
        let wait = WaitPolicy::new(Instant::now() + LONG);
        let write = request(&client, &held, Access::Write, LONG);
        let reached = std::cell::Cell::new(false);
        let attempts = async {
            let asked = request(&client, &free, access, LONG);
            let attempt = client.try_acquire(&asked).await.unwrap();
            attempt.into_lease().expect("a free name");
            reached.set(true);
            client.acquire(&write, &wait).await
        };
        let outcome = tokio::time::timeout(at, attempts).await;
        assert!(outcome.is_err(), "step {step}: the wait ended: {outcome:?}");
        waited += usize::from(reached.get());
        client.close().await.unwrap();
        assert_eq!(rows(file.path(), &free).await, [], "step {step} ({at:?})");
        assert_eq!(
            rows(file.path(), &held).await,
            [rw(fence(&read), "read")],
            "step {step} ({at:?})"
        );
    }
    eprintln!("{waited} of {steps} attempts cut short while waiting; none left a row");
    assert!(
        waited > 0 && waited <= steps as usize,
        "step 0 is cut before its grant and the last step in its wait"
    );
    holder.release(&read).await.unwrap();
}

/// The expiry of `n`'s one intent in the file.
async fn intent_expiry(path: &Path, n: &LockName) -> i64 {
    let mut conn = sqlx::SqliteConnection::connect(&support::url(path))
        .await
        .unwrap();
    let expiry = sqlx::query_scalar(
        "SELECT expires_at FROM distlock_leases WHERE kind = 'intent' AND name = ?1",
    )
    .bind(n.as_str())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    expiry
}

/// A waiting writer woken while it is still refused writes nothing: its
/// intent's expiry moves only once a third of its TTL has passed, so a
/// wake-up for nothing costs no durable write. Here five wake-ups (the
/// reader's presence file touched) within the first third of a minute's
/// TTL leave the intent as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_writer_writes_nothing_until_its_intent_is_due() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("rw/woken-writer");
    let read = take(&a, &n, Access::Read).await;
    let writer = connect(&file).await;
    let write = request(&writer, &n, Access::Write, LONG);
    let wait = WaitPolicy::new(Instant::now() + LONG).recheck(LONG);
    let waiting = tokio::spawn({
        let (writer, wait) = (writer.clone(), wait.clone());
        async move { writer.acquire(&write, &wait).await }
    });
    intent_of(file.path(), &n).await;
    let written = intent_expiry(file.path(), &n).await;
    let reader_file = presence(file.path(), fence(&read));
    for woken in 1..=5 {
        let attempts = wait.attempts();
        // A change of the reader's presence file wakes the writer.
        let mode = std::fs::metadata(&reader_file).unwrap().permissions();
        std::fs::set_permissions(&reader_file, mode).unwrap();
        let what = format!("the writer's attempt after wake-up {woken}");
        until(scaled(Duration::from_secs(5)), &what, || async {
            wait.attempts() > attempts
        })
        .await;
    }
    assert_eq!(
        intent_expiry(file.path(), &n).await,
        written,
        "a refused attempt moved the intent"
    );
    a.release(&read).await.unwrap();
    let granted = waiting.await.unwrap().unwrap().expect("the write");
    writer.release(&granted).await.unwrap();
}
