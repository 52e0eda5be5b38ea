//! The one wait loop: what it does with a store wake-up after a held
//! attempt and after a failed one, and with a wake-up that could not be
//! armed (virtual clock).

use std::time::Duration;

use lockcore::backend::wait::{WaitPolicy, Waiter, Wakeup, wait};
use lockcore::backend::{Moment, async_trait};
use lockcore::{
    Attempt, Backoff, Capabilities, FencingToken, Lease, LockError, LockName, OwnerToken,
};
use tokio::time::{Instant, sleep};

const RECHECK: Duration = Duration::from_secs(30);
const BACKOFF: Duration = Duration::from_millis(100);

fn lease() -> Lease {
    let ttl = Capabilities::new("test")
        .effective_ttl(Duration::from_secs(1))
        .unwrap();
    Lease::new(
        LockName::new("n").unwrap(),
        OwnerToken::new(),
        FencingToken::new(1).unwrap(),
        ttl,
        Moment::now(),
    )
}

fn policy() -> WaitPolicy {
    WaitPolicy::new(Instant::now() + Duration::from_secs(600))
        .backoff(Backoff::new(BACKOFF, BACKOFF))
        .recheck(RECHECK)
}

/// Arms what `wakeups` says (a wake-up firing after that long, or an arm
/// error) and answers with `attempts`, in order.
struct Script {
    wakeups: Vec<Result<Duration, LockError>>,
    attempts: Vec<Result<Attempt, LockError>>,
}

#[async_trait]
impl Waiter for Script {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        match self.wakeups.remove(0) {
            Ok(after) => Ok(Some(Box::pin(sleep(after)))),
            Err(e) => Err(e),
        }
    }
    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        self.attempts.remove(0)
    }
}

fn held() -> Result<Attempt, LockError> {
    Ok(Attempt::Held { expires_in: None })
}

fn unavailable() -> LockError {
    LockError::unavailable("test", "connection reset")
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_after_a_held_attempt_retries_at_once() {
    let mut script = Script {
        wakeups: vec![Ok(Duration::from_millis(50)), Ok(RECHECK)],
        attempts: vec![held(), Ok(Attempt::Acquired(lease()))],
    };
    let started = Instant::now();
    assert!(wait(&policy(), &mut script).await.unwrap().is_some());
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(50),
        "woken by the store, not by the {RECHECK:?} re-check"
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_failed_attempt_the_backoff_runs_out_whatever_the_wake_up() {
    // Wake-ups that fire at once: only the backoff spaces the retries. Each
    // pause is random in 0..=100 ms (full jitter); 20 of them add up to less
    // than 100 ms with a chance of 1 in 20! (below 1e-18).
    const FAILURES: usize = 20;
    let mut attempts: Vec<_> = (0..FAILURES).map(|_| Err(unavailable())).collect();
    attempts.push(Ok(Attempt::Acquired(lease())));
    let mut script = Script {
        wakeups: (0..=FAILURES).map(|_| Ok(Duration::ZERO)).collect(),
        attempts,
    };
    let started = Instant::now();
    assert!(wait(&policy(), &mut script).await.unwrap().is_some());
    let waited = started.elapsed();
    assert!(
        waited >= BACKOFF && waited <= BACKOFF * FAILURES as u32,
        "{FAILURES} backoffs took {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_that_cannot_be_armed_falls_back_to_backoff_unless_permanent() {
    let mut transient = Script {
        wakeups: vec![Err(unavailable()), Ok(RECHECK)],
        attempts: vec![held(), Ok(Attempt::Acquired(lease()))],
    };
    let started = Instant::now();
    assert!(wait(&policy(), &mut transient).await.unwrap().is_some());
    assert!(
        started.elapsed() <= BACKOFF,
        "backed off, no re-check wait: {:?}",
        started.elapsed()
    );

    let mut permanent = Script {
        wakeups: vec![Err(LockError::store("test", "denied"))],
        attempts: vec![Ok(Attempt::Acquired(lease()))],
    };
    assert!(matches!(
        wait(&policy(), &mut permanent).await,
        Err(LockError::Store { .. })
    ));
    assert_eq!(
        permanent.attempts.len(),
        1,
        "no attempt after a permanent error"
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_expiring_first_is_retried_a_millisecond_after_it() {
    let expires_in = Duration::from_secs(5);
    let mut script = Script {
        wakeups: vec![Ok(RECHECK), Ok(RECHECK)],
        attempts: vec![
            Ok(Attempt::Held {
                expires_in: Some(expires_in),
            }),
            Ok(Attempt::Acquired(lease())),
        ],
    };
    let started = Instant::now();
    assert!(wait(&policy(), &mut script).await.unwrap().is_some());
    assert_eq!(started.elapsed(), expires_in + Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn a_permanent_attempt_error_ends_the_wait_at_once() {
    let mut script = Script {
        wakeups: vec![Ok(RECHECK), Ok(RECHECK)],
        attempts: vec![
            Err(LockError::store("test", "denied")),
            Ok(Attempt::Acquired(lease())),
        ],
    };
    let started = Instant::now();
    assert!(matches!(
        wait(&policy(), &mut script).await,
        Err(LockError::Store { .. })
    ));
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(script.attempts.len(), 1, "retried a permanent error");
}
