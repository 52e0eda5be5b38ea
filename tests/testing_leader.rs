//! Testing your code, example 2: a leader must step down when it loses its
//! leadership. An operator force-releases the election's lock; the leader
//! hears it at once (`lost()`), and must stop publishing before the next
//! leader starts.

#![cfg(feature = "testing")]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlock::testing::{RecordingResource, TestStore};
use distlock::{HolderLabel, Leadership, Locker};
use tokio::task::JoinHandle;
use tokio::time::{Instant, interval, sleep, sleep_until};

type Schedule = RecordingResource<Vec<String>>;

/// The application: while it leads, publishes the schedule every second
/// under its term; steps down the moment the leadership is lost.
async fn lead(leadership: Leadership, schedule: Arc<Schedule>) {
    let mut every_second = interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            biased;
            _ = leadership.lost() => return,
            _ = every_second.tick() => {}
        }
        let me = leadership.label().to_string();
        if schedule.write(leadership.term(), |s| s.push(me)).is_err() {
            return;
        }
    }
}

/// A wrong application: steps down only when the schedule refuses its term.
async fn lead_until_refused(leadership: Leadership, schedule: Arc<Schedule>) {
    let mut every_second = interval(Duration::from_secs(1));
    loop {
        every_second.tick().await;
        let me = leadership.label().to_string();
        if schedule.write(leadership.term(), |s| s.push(me)).is_err() {
            return;
        }
    }
}

/// Campaigns as `node` on a client of `store`, then runs `lead` on the
/// schedule while it leads.
fn candidate<L, F>(
    store: &TestStore,
    node: &str,
    lead: L,
    schedule: &Arc<Schedule>,
) -> JoinHandle<()>
where
    L: FnOnce(Leadership, Arc<Schedule>) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let election = Locker::new(store.client()).election("scheduler").unwrap();
    let (label, schedule) = (HolderLabel::new(node).unwrap(), schedule.clone());
    tokio::spawn(async move {
        let leadership = election.campaign(label).await.unwrap();
        schedule.watch(leadership.guard());
        lead(leadership, schedule).await;
    })
}

/// node-a leads, node-b waits its turn; at 5.5 s an operator evicts the
/// leader. Returns the schedule 3 s later, and whether node-a had stepped
/// down by then.
async fn leader_evicted<L, F>(lead: L) -> (Arc<Schedule>, bool)
where
    L: FnOnce(Leadership, Arc<Schedule>) -> F + Clone + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let (store, started) = (TestStore::new(), Instant::now());
    let schedule = Arc::new(Schedule::new(Vec::new()));
    let node_a = candidate(&store, "node-a", lead.clone(), &schedule);
    sleep(Duration::from_millis(1)).await;
    let _node_b = candidate(&store, "node-b", lead, &schedule);

    sleep_until(started + Duration::from_millis(5_500)).await;
    store.evict("scheduler").await.expect("a leader to evict");
    sleep(Duration::from_secs(3)).await;
    (schedule, node_a.is_finished())
}

#[tokio::test(start_paused = true)]
async fn the_leader_steps_down_when_evicted() {
    let (schedule, stepped_down) = leader_evicted(lead).await;
    schedule.assert_no_write_after_loss();
    assert!(stepped_down);
    // node-a published at 0 s..5 s, node-b from the eviction on.
    let published = schedule.read();
    assert_eq!(published[..6], ["node-a"; 6]);
    assert_eq!(published[6..], ["node-b"; 3]);
}

#[tokio::test(start_paused = true)]
async fn the_kit_catches_a_leader_that_waits_for_a_refusal() {
    let (schedule, stepped_down) = leader_evicted(lead_until_refused).await;
    let caught = schedule.check_no_write_after_loss().unwrap_err();
    // Fencing refused the old leader's write, so the schedule is intact and
    // the leader did step down; the kit still sees it tried to publish
    // after it was told it no longer led.
    assert_eq!(caught.writes.len(), 1, "{caught}");
    assert!(caught.writes[0].outcome.is_err(), "{caught}");
    assert_eq!(
        caught.writes[0].after_loss,
        Some(Duration::from_millis(500))
    );
    assert!(stepped_down);
}
