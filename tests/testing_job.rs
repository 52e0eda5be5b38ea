//! Testing your code, example 3: a job must not run on two nodes at once.
//! node-a sends the day's invoices, one every 7 s; its renewals start to
//! hang, so its lease runs out; node-b, waiting for the lock, takes over
//! and sends the rest. node-a must have stopped before node-b starts.

#![cfg(feature = "testing")]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock::testing::{Change, Faults, RecordingResource, TestStore};
use distlock::{HolderLabel, LockGuard, Locker};
use tokio::task::JoinHandle;
use tokio::time::{Instant, interval, sleep, sleep_until};

/// The numbers of the invoices sent, in order.
type Invoices = RecordingResource<Vec<u32>>;

const INVOICES: u32 = 10;

/// The application's job: sends the invoices not sent yet, one every 7 s,
/// while it holds the lock.
async fn send_invoices(guard: LockGuard, invoices: Arc<Invoices>) {
    let mut every = interval(Duration::from_secs(7));
    loop {
        tokio::select! {
            biased;
            _ = guard.lost() => return,
            _ = every.tick() => {}
        }
        if !send_next(&guard, &invoices) {
            return;
        }
    }
}

/// A wrong job: checks the lease once, when it starts.
async fn send_invoices_checked_once(guard: LockGuard, invoices: Arc<Invoices>) {
    let mut every = interval(Duration::from_secs(7));
    if !guard.is_held() {
        return;
    }
    loop {
        every.tick().await;
        if !send_next(&guard, &invoices) {
            return;
        }
    }
}

/// Sends the next invoice under `guard`'s fence: `false` once all are sent
/// or the write was refused.
fn send_next(guard: &LockGuard, invoices: &Invoices) -> bool {
    let next = invoices.read().len() as u32;
    next < INVOICES
        && invoices
            .write(guard.fencing_token(), |sent| sent.push(next))
            .is_ok()
}

/// One node, `name`: at `starts_at` its scheduler waits for the job's lock (a 30 s
/// lease), then runs `job`. The node's faults, and its task.
fn node<J, F>(
    store: &TestStore,
    name: &str,
    starts_at: Instant,
    job: J,
    invoices: &Arc<Invoices>,
) -> (Faults, JoinHandle<()>)
where
    J: FnOnce(LockGuard, Arc<Invoices>) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let client = store.client();
    let faults = client.faults();
    let locker = Locker::new(client)
        .ttl(Duration::from_secs(30))
        .label(HolderLabel::new(name).unwrap())
        .max_wait(Duration::from_secs(120));
    let invoices = invoices.clone();
    let task = tokio::spawn(async move {
        sleep_until(starts_at).await;
        let guard = locker.acquire("invoicing").await.unwrap();
        invoices.watch(&guard);
        job(guard, invoices).await;
    });
    (faults, task)
}

/// node-a starts at 0 s, node-b at 2 s; node-a's renewals hang from 15 s
/// on, so its lease is lost at about 39.7 s and the store frees the name
/// at 40 s. Returns the invoices and the store once both nodes are done.
async fn renewals_hang_on_node_a<J, F>(job: J) -> (Arc<Invoices>, TestStore)
where
    J: FnOnce(LockGuard, Arc<Invoices>) -> F + Clone + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let (store, start) = (TestStore::new(), Instant::now());
    let invoices = Arc::new(Invoices::new(Vec::new()));
    let (a_faults, node_a) = node(&store, "node-a", start, job.clone(), &invoices);
    let (_, node_b) = node(
        &store,
        "node-b",
        start + Duration::from_secs(2),
        job,
        &invoices,
    );

    sleep(Duration::from_secs(15)).await;
    a_faults.hang_renewals();
    node_a.await.unwrap();
    node_b.await.unwrap();
    (invoices, store)
}

#[tokio::test(start_paused = true)]
async fn the_job_never_runs_on_two_nodes_at_once() {
    let (invoices, store) = renewals_hang_on_node_a(send_invoices).await;
    invoices.assert_no_write_after_loss();
    assert_eq!(invoices.read(), (0..INVOICES).collect::<Vec<_>>());
    // node-a sent 0..=5 (0 s to 35 s) and let go of the lock when it lost
    // it; node-b, granted it then, sent the rest.
    let fences: Vec<_> = invoices.attempts().iter().map(|a| a.fence).collect();
    assert!(fences[..6].iter().all(|f| *f == fences[0]) && fences[6] > fences[0]);
    let grants: Vec<_> = store
        .history()
        .into_iter()
        .filter(|e| e.change != Change::Renewed)
        .map(|e| (e.change, e.label.to_string()))
        .collect();
    let expected = [
        (Change::Granted, "node-a"),
        (Change::Released, "node-a"),
        (Change::Granted, "node-b"),
        (Change::Released, "node-b"),
    ];
    assert_eq!(grants, expected.map(|(c, l)| (c, l.to_owned())));
}

#[tokio::test(start_paused = true)]
async fn the_kit_catches_a_job_that_checks_its_lease_only_once() {
    let (invoices, _) = renewals_hang_on_node_a(send_invoices_checked_once).await;
    let caught = invoices.check_no_write_after_loss().unwrap_err();
    // node-a tried invoice 7 at 42 s, after node-b had sent 6 at 40 s:
    // fenced out, but the job ran on two nodes for 2 s.
    assert_eq!(caught.writes.len(), 1, "{caught}");
    assert_eq!(
        caught.writes[0].after_loss,
        Some(Duration::from_millis(2_302))
    );
    assert!(caught.writes[0].outcome.is_err(), "{caught}");
}
