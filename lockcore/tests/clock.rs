//! Clock readings: what a `Moment` keeps, how it moves, that the real boot
//! clock is read (it is what makes a host suspend count), and how the
//! renewer reads the clocks: only when it looks at its guards, and at the
//! instant a deadline passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::backend::{Clock, Moment, SystemClock};
use lockcore::{Locker, LossReason, MemoryBackend};
use tokio::time::Instant;

#[test]
fn a_reading_keeps_its_parts_and_moves_both_clocks_forward() {
    let t0 = Instant::now();
    let reading = Moment::from_parts(t0, Some(Duration::from_secs(5)));
    assert_eq!(reading.mono(), t0);
    assert_eq!(reading.boot(), Some(Duration::from_secs(5)));
    let later = reading.after(Duration::from_secs(2));
    assert_eq!(
        later,
        Moment::from_parts(t0 + Duration::from_secs(2), Some(Duration::from_secs(7)))
    );
    assert_eq!(later.since(reading), Duration::from_secs(2));
    let no_boot = Moment::from_parts(t0, None).after(Duration::from_secs(1));
    assert_eq!(no_boot.boot(), None);
}

/// The boot clock advances at least as much as real time passes (it is
/// CLOCK_MONOTONIC plus time suspended): two readings 20 ms apart on this
/// thread differ by at least that on it, through `Moment::now` and through
/// the system clock alike.
#[cfg(target_os = "linux")]
#[test]
fn the_boot_clock_counts_real_time() {
    let pause = Duration::from_millis(20);
    for read in [Moment::now as fn() -> Moment, || SystemClock.now()] {
        let before = read();
        std::thread::sleep(pause);
        let after = read();
        let (Some(b0), Some(b1)) = (before.boot(), after.boot()) else {
            panic!("no boot clock reading on Linux");
        };
        assert!(b1 - b0 >= pause, "boot clock moved {:?}", b1 - b0);
        assert!(after.since(before) >= pause);
    }
}

/// The system clocks, counting how often they are read.
#[derive(Debug, Default)]
struct CountingClock(AtomicUsize);

impl CountingClock {
    fn reads(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Clock for CountingClock {
    fn now(&self) -> Moment {
        self.0.fetch_add(1, Ordering::SeqCst);
        SystemClock.now()
    }
}

/// A look at the guards that finds nothing due schedules the next look in
/// the future: while no time passes, the renewer reads no clock however
/// often it runs. A look scheduled in the past would spin, and virtual time
/// would never pass again (the runtime is never idle), so this test yields
/// instead of sleeping once the renewer has looked.
#[tokio::test(start_paused = true)]
async fn the_renewer_reads_the_clocks_only_when_it_looks() {
    let clock = Arc::new(CountingClock::default());
    // The renewer looks at the long-hold threshold, long before a renewal is due.
    let threshold = Duration::from_millis(300);
    let locker = Locker::new(MemoryBackend::new())
        .ttl(Duration::from_secs(30))
        .long_hold(threshold)
        .clock(clock.clone());
    let acquired = Instant::now();
    let guard = locker.acquire("idle").await.unwrap();
    tokio::time::sleep_until(acquired + threshold).await;
    let before = clock.reads();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let reads = clock.reads() - before;
    // That look reads the clocks once; a spinning renewer, thousands of times.
    assert!(
        reads < 10,
        "the clocks were read {reads} times while no time passed"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(guard.is_held(), "{:?}", guard.loss_reason());
}

/// A lease no renewal keeps is lost the instant its deadline passes, with
/// no one asking `is_held`: the renewer looks then and judges it on the
/// clocks. Yields after the deadline, not sleeps: a renewer that never
/// judged it passed would look again at once, for ever, and virtual time
/// would not pass again. The TTL is under the renewer's once-a-second
/// look, so the deadline is its first look (a renewer that spins from its
/// first look then fails the test above instead of hanging this one).
#[tokio::test(start_paused = true)]
async fn an_unrenewed_lease_is_lost_the_instant_its_deadline_passes() {
    let locker = Locker::new(MemoryBackend::new())
        .ttl(Duration::from_millis(800))
        .auto_renew(false);
    let guard = locker.acquire("unrenewed").await.unwrap();
    let deadline = guard.lease().deadline();
    tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
    assert_eq!(guard.loss_reason(), None, "lost before its deadline");
    tokio::time::sleep_until(deadline).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(guard.loss_reason(), Some(LossReason::DeadlinePassed));
    assert!(guard.lost_token().is_cancelled());
}
