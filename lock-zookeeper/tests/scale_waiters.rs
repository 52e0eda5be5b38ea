//! Many waiters on one name in one process: one session (one connection),
//! memory linear in the waiters, every one served in arrival order, and the
//! requests per waiter bounded by a constant (one shared view of the queue
//! per name, not one per waiter). Prints what it measured.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::stores::zookeeper;
use lockcore::{FencingToken, LockError, Locker};
use support::{answered, children, connect, connections, peak_rss, raw, session_id, unique};
use tokio::time::Instant;

const WAITERS: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_waiters_on_one_name_are_served_in_order() {
    let store = zookeeper::shared();
    let backend = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let sid = session_id(&backend);
    let locker = Locker::new(backend.clone()).ttl(backend.session_timeout());
    let name = unique("waiters");
    let parent = backend.lock_path(&name);
    let holder = locker.acquire(&name).await.unwrap();

    let (rss_before, requests_before) = (peak_rss(), answered(store.addr(), sid));
    let served: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
    let wait = Duration::from_secs(120);
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (locker, name, served) = (locker.clone(), name.clone(), served.clone());
            tokio::spawn(async move {
                let guard = locker.acquire_timeout(&name, wait).await?;
                served.lock().unwrap().push(guard.fencing_token());
                guard.release().await?;
                Ok::<_, LockError>(())
            })
        })
        .collect();
    let queueing = Instant::now();
    until(Duration::from_secs(60), "every waiter in line", || async {
        children(&observer, &parent).await.len() == WAITERS + 1
    })
    .await;
    let queued = queueing.elapsed();
    let released = Instant::now();
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    let all_served = released.elapsed();
    let requests = answered(store.addr(), sid) - requests_before;
    let grown = peak_rss().saturating_sub(rss_before);
    let links = connections(store.addr(), sid).len();
    eprintln!(
        "{WAITERS} waiters: queued in {queued:?}, all served {all_served:?} after the first \
         release; {links} connection(s); {requests} requests ({:.1} per waiter); peak RSS +{} MiB",
        requests as f64 / WAITERS as f64,
        grown >> 20
    );

    let served = served.lock().unwrap().clone();
    assert_eq!(served.len(), WAITERS, "every waiter is served");
    // A fence is the czxid of the waiter's node: its place in line. FIFO
    // means grants in fence order.
    let out_of_order = served.windows(2).filter(|w| w[1] <= w[0]).count();
    assert_eq!(out_of_order, 0, "grants out of arrival order");
    assert_eq!(
        links, 1,
        "one session, one connection, whatever the waiters"
    );
    assert!(
        requests <= 8 * WAITERS as u64,
        "{requests} requests for {WAITERS} waiters: re-checks are not bounded"
    );
    assert!(
        grown <= 200 << 20,
        "peak RSS grew by {} MiB for {WAITERS} waiters",
        grown >> 20
    );
    assert!(
        all_served <= Duration::from_secs(30).mul_f64(support::time_scale()),
        "serving {WAITERS} waiters took {all_served:?}"
    );
}
