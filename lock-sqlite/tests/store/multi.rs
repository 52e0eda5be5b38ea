//! Multi-locks on the lock file: one `BEGIN IMMEDIATE` grants every lock
//! of a batch, each a row and a presence file of its own with a fence from
//! the file's one counter (above its floor), or writes nothing: a batch
//! refused on a held name, or failing midway through its writes, leaves no
//! row, no presence file locked, and the counter where it was; a batch cut
//! short at any point leaves nothing once its client is closed.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lock_conformance::kit::{poll, scaled};
use lock_sqlite::SqliteBackend;
use lockcore::backend::{Kind, LockBackendExt, LockRequest};
use lockcore::{
    AttemptEach, FencingToken, HolderLabel, Lease, LockBackend, LockError, LockName, ReleaseOutcome,
};
use sqlx::Connection;
use tokio::time::Instant;

use crate::presence::{presence, presence_files};
use crate::support::{self, name};

const LONG: Duration = Duration::from_secs(60);

async fn connect(file: &support::SqliteFactory) -> SqliteBackend {
    SqliteBackend::connect(&support::url(file.path()))
        .await
        .unwrap()
}

/// The requests of a batch of `names`, labelled `batch`.
fn batch(b: &SqliteBackend, names: &[LockName]) -> Vec<LockRequest> {
    let ttl = b.capabilities().effective_ttl(LONG).unwrap();
    (names.iter())
        .map(|n| LockRequest::new(n.clone(), ttl).with_label(HolderLabel::new("batch").unwrap()))
        .collect()
}

async fn take(b: &SqliteBackend, n: &LockName) -> Lease {
    (b.try_acquire_for(n, LONG).await.unwrap())
        .into_lease()
        .unwrap_or_else(|| panic!("{n} is free"))
}

/// Every row of the lock file: `(kind, name, fence)`.
async fn rows(path: &Path) -> Vec<(String, String, i64)> {
    let mut conn = sqlx::SqliteConnection::connect(&support::url(path))
        .await
        .unwrap();
    let rows = sqlx::query_as("SELECT kind, name, fence FROM distlock_leases ORDER BY fence")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    rows
}

fn lock_row(lease: &Lease) -> (String, String, i64) {
    let name = lease.name().as_str().to_owned();
    ("lock".to_owned(), name, fence(lease))
}

fn fence(lease: &Lease) -> i64 {
    lease.fence().get() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_a_row_and_a_presence_file_per_lock_above_the_floor() {
    let file = support::SqliteFactory::fresh();
    let (a, b) = (connect(&file).await, connect(&file).await);
    let floor = FencingToken::new(1_000_000).unwrap();
    a.raise_fence_floor(floor).await.unwrap();
    let names = [name("multi/a"), name("multi/b"), name("multi/c")];
    let AttemptEach::Acquired(leases) = a.try_acquire_each(&batch(&a, &names)).await.unwrap()
    else {
        panic!("a batch of free names was refused");
    };
    let granted: Vec<&LockName> = leases.iter().map(Lease::name).collect();
    assert_eq!(
        granted,
        names.iter().collect::<Vec<_>>(),
        "in request order"
    );
    assert!(leases[0].fence() > floor);
    assert!(
        leases.windows(2).all(|w| w[0].fence() < w[1].fence()),
        "one fence each, from the one counter"
    );
    let fences: Vec<i64> = leases.iter().map(fence).collect();
    assert_eq!(
        rows(file.path()).await,
        leases.iter().map(lock_row).collect::<Vec<_>>()
    );
    assert_eq!(presence_files(file.path(), true), fences);
    for lease in &leases {
        let holders = b.holders(lease.name(), Kind::Lock).await.unwrap();
        let seen: Vec<_> = (holders.iter())
            .map(|h| (h.fence, h.label.as_ref().map(ToString::to_string)))
            .collect();
        assert_eq!(seen, [(lease.fence(), Some("batch".to_owned()))]);
        // Each is a lease of its own: another client is refused it.
        assert!(
            b.try_acquire_for(lease.name(), LONG)
                .await
                .unwrap()
                .into_lease()
                .is_none()
        );
    }
    // Each released on its own frees its name at once, its file removed.
    assert_eq!(
        a.release(&leases[1]).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(!presence(file.path(), fences[1]).exists());
    let next = take(&b, &names[1]).await;
    assert!(next.fence() > leases[2].fence());
    for lease in [&leases[0], &leases[2]] {
        assert_eq!(a.release(lease).await.unwrap(), ReleaseOutcome::Released);
    }
    b.release(&next).await.unwrap();
    assert_eq!(rows(file.path()).await, []);
    assert_eq!(presence_files(file.path(), false), Vec::<i64>::new());
}

/// A batch of no lock, of one name twice, or with a request that is not a
/// lock is refused with a typed error before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_batch_is_refused() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let n = name("multi/bad");
    let twice = batch(&a, &[n.clone(), n.clone()]);
    let mut permit = batch(&a, &[name("multi/bad-permit")]);
    permit[0] = permit[0].clone().with_permits(2);
    for (what, requests) in [("none", Vec::new()), ("twice", twice), ("a permit", permit)] {
        let refused = a.try_acquire_each(&requests).await;
        assert!(
            matches!(refused, Err(LockError::InvalidConfig { .. })),
            "{what}: {refused:?}"
        );
    }
    assert_eq!(rows(file.path()).await, []);
}

/// A batch with a held name writes nothing: no row, no presence file, no
/// fence used up (the next grant takes the next fence), not even the
/// removal of a free name's expired row; it names the held name and its
/// holder's remaining time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_writes_nothing() {
    let file = support::SqliteFactory::fresh();
    let (a, b) = (connect(&file).await, connect(&file).await);
    let names = [name("multi/free"), name("multi/held"), name("multi/last")];
    let expired = (a
        .try_acquire_for(&names[0], Duration::from_millis(1))
        .await
        .unwrap())
    .into_lease()
    .unwrap();
    poll::until(
        scaled(Duration::from_secs(5)),
        "the row expires",
        || async { a.holders(&names[0], Kind::Lock).await.unwrap().is_empty() },
    )
    .await;
    let held = take(&b, &names[1]).await;
    let before = rows(file.path()).await;
    assert_eq!(before, [lock_row(&expired), lock_row(&held)]);
    let files = presence_files(file.path(), false);
    let refused = a.try_acquire_each(&batch(&a, &names)).await.unwrap();
    let AttemptEach::Held {
        name: at,
        expires_in,
    } = refused
    else {
        panic!("a batch with a held name was granted: {refused:?}");
    };
    assert_eq!(at, names[1]);
    assert!(expires_in.is_some_and(|left| left > Duration::ZERO && left <= LONG));
    assert_eq!(rows(file.path()).await, before);
    assert_eq!(presence_files(file.path(), false), files, "a file was made");
    assert_eq!(presence_files(file.path(), true), [fence(&held)]);
    let next = take(&a, &names[2]).await;
    assert_eq!(fence(&next), fence(&held) + 1, "the batch used up a fence");
    a.release(&next).await.unwrap();
    b.release(&held).await.unwrap();
}

/// A batch whose write fails midway (the second lock's presence file is
/// held by a live process: the counter went back, a restore) commits
/// nothing: the first lock's row goes with the transaction, its presence
/// file is removed, the live one is left alone, and the counter is where
/// it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_failing_midway_leaves_nothing() {
    let file = support::SqliteFactory::fresh();
    let a = connect(&file).await;
    let probe = take(&a, &name("multi/probe")).await;
    a.release(&probe).await.unwrap();
    let first = fence(&probe) + 1;
    // A live process's proof of life on the fence the second lock gets.
    let live = std::fs::File::create(presence(file.path(), first + 1)).unwrap();
    // SAFETY: flock on a descriptor we own.
    let flocked = unsafe { libc::flock(live.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(flocked, 0, "{}", std::io::Error::last_os_error());
    let names = [name("multi/x"), name("multi/y"), name("multi/z")];
    let failed = a.try_acquire_each(&batch(&a, &names)).await;
    let Err(e @ LockError::Store { .. }) = failed else {
        panic!("a batch whose second fence is in use: {failed:?}");
    };
    assert!(
        e.to_string().contains("already held by a live process"),
        "{e}"
    );
    assert_eq!(rows(file.path()).await, []);
    assert!(
        !presence(file.path(), first).exists(),
        "the first lock's file was left"
    );
    assert_eq!(
        presence_files(file.path(), true),
        [first + 1],
        "the live file was touched"
    );
    drop(live);
    let next = take(&a, &names[0]).await;
    assert_eq!(fence(&next), first, "the failed batch used up a fence");
    a.release(&next).await.unwrap();
    a.close().await.unwrap();
}

/// A batch cut short at every point of its transaction (a timeout, a
/// dropped future), its client closed at once, leaves no row and no
/// presence file locked: one granted is released by the close, one whose
/// commit was under way when it was dropped is undone, lock by lock, by
/// clean-ups that the close finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_cut_short_anywhere_leave_nothing_once_closed() {
    let file = support::SqliteFactory::fresh();
    let probe = connect(&file).await;
    let names = |step: u32| -> Vec<LockName> {
        (0..3)
            .map(|i| name(&format!("multi/cut-{step}-{i}")))
            .collect()
    };
    // How long a whole batch takes here (the quickest of a few, the first
    // warming up), to cut it at every point of it.
    let mut whole = Duration::MAX;
    for round in 0..5 {
        let started = std::time::Instant::now();
        let asked = batch(&probe, &names(1000 + round));
        let AttemptEach::Acquired(leases) = probe.try_acquire_each(&asked).await.unwrap() else {
            panic!("a batch of free names was refused");
        };
        whole = whole.min(started.elapsed());
        for lease in &leases {
            probe.release(lease).await.unwrap();
        }
    }
    let whole = scaled(whole);
    probe.close().await.unwrap();
    // Step 0 is cut at its first wait, the last one runs to the end, and
    // the steps between sweep the batch (where, depends on this machine's
    // load: the ends are what is sure).
    let steps = 60_u32;
    let (mut granted, mut cut) = (0, 0);
    for step in 0..=steps + 1 {
        let client = Arc::new(connect(&file).await);
        let at = match step {
            0 => Some(Duration::ZERO),
            s if s > steps => None,
            s => Some(whole * 2 * s / steps),
        };
        let asked = batch(&client, &names(step));
        let attempt = client.try_acquire_each(&asked);
        let outcome = match at {
            Some(at) => tokio::time::timeout(at, attempt).await.ok(),
            None => Some(attempt.await),
        };
        match outcome {
            Some(attempt) => {
                let AttemptEach::Acquired(leases) = attempt.unwrap() else {
                    panic!("step {step}: a batch of free names was refused");
                };
                assert_eq!(leases.len(), 3);
                granted += 1;
            }
            None => cut += 1,
        }
        client.close().await.unwrap();
        let left = rows(file.path()).await;
        assert_eq!(
            left,
            [],
            "step {step} (cut after {at:?}): rows left after close"
        );
        let held = presence_files(file.path(), true);
        assert_eq!(
            held,
            Vec::<i64>::new(),
            "step {step} (cut after {at:?}): files locked"
        );
    }
    eprintln!("{granted} batches completed, {cut} cut short; none left a row");
    assert!(
        cut > 0 && granted > 0,
        "step 0 is always cut short and the last step always completes"
    );
}

/// `SqliteBackend`, counting its multi-lock attempts.
#[derive(Debug)]
struct Counted {
    inner: SqliteBackend,
    attempts: Arc<std::sync::atomic::AtomicU32>,
}

#[lockcore::backend::async_trait]
impl LockBackend for Counted {
    fn capabilities(&self) -> lockcore::Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, request: &LockRequest) -> Result<lockcore::Attempt, LockError> {
        self.inner.try_acquire(request).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.inner.renew_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }
    async fn holders(&self, n: &LockName, kind: Kind) -> Result<Vec<lockcore::Holder>, LockError> {
        self.inner.holders(n, kind).await
    }
    async fn evict(
        &self,
        n: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<lockcore::Holder>, LockError> {
        self.inner.evict(n, expected).await
    }
    async fn watch(
        &self,
        n: &LockName,
        kind: Kind,
    ) -> Result<Option<lockcore::backend::wait::Wakeup>, LockError> {
        self.inner.watch(n, kind).await
    }
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        (self.attempts).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.try_acquire_each(requests).await
    }
}

/// A multi-lock waiting for a held name next to free ones is woken by the
/// held one's release, not by its free names over and over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_batch_does_not_spin_on_its_free_names() {
    let file = support::SqliteFactory::fresh();
    let holder = connect(&file).await;
    let names = [
        name("multi/spin-a"),
        name("multi/spin-b"),
        name("multi/spin-c"),
    ];
    let held = take(&holder, &names[1]).await;
    let attempts = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = Counted {
        inner: connect(&file).await,
        attempts: attempts.clone(),
    };
    let locker = lockcore::Locker::new(counted);
    let waited = locker
        .acquire_all_timeout(names.iter().cloned(), Duration::from_millis(500))
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    let made = attempts.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{made} attempts in 500 ms");
    assert!(made <= 5, "{made} attempts in 500 ms: the wait spun");
    // Still woken by the held name's release, well before the 1 s re-check.
    let waiting = tokio::spawn(async move {
        let taken = locker
            .acquire_all_timeout(names.iter().cloned(), LONG)
            .await;
        (taken, Instant::now())
    });
    poll::until(
        scaled(Duration::from_secs(5)),
        "the batch waits again",
        || {
            let attempts = attempts.clone();
            async move { attempts.load(std::sync::atomic::Ordering::Relaxed) > made }
        },
    )
    .await;
    let released = Instant::now();
    holder.release(&held).await.unwrap();
    let (taken, at) = waiting.await.unwrap();
    let guards = taken.expect("the batch after the release");
    assert!(
        at - released < scaled(Duration::from_millis(500)),
        "woken {:?} after the release",
        at - released
    );
    guards.release().await.unwrap();
}
