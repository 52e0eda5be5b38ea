//! Waiting for a condition instead of sleeping on a guess: check it, and
//! again every 10 ms (scaled by `LOCK_TEST_TIME_SCALE`), until it holds or
//! the time is up. One loop, [`try_eventually`], under every front-end:
//! [`eventually`] and [`until`] (panic when the time is up: adapter tests),
//! [`Ctx::eventually`](crate::Ctx::eventually) (fails the case), and
//! [`blocking`] / [`blocking_until`] for plain threads (the launcher
//! waiting for a server).
//!
//! `within` is taken as given: it is the bound being checked, so derive it
//! from what the backend declares and scale it where it is a guess.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::env;

/// A condition that did not come true in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    what: String,
    within: Duration,
}

impl TimedOut {
    /// What was awaited.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// How long.
    pub fn within(&self) -> Duration {
        self.within
    }
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} did not happen within {:?}", self.what, self.within)
    }
}

impl std::error::Error for TimedOut {}

impl From<TimedOut> for std::io::Error {
    fn from(e: TimedOut) -> Self {
        std::io::Error::new(std::io::ErrorKind::TimedOut, e.to_string())
    }
}

/// How often a condition is checked: 10 ms, scaled.
pub fn interval() -> Duration {
    env::scaled(Duration::from_millis(10))
}

/// Checks `check` until it yields `Ok(Some(value))` and returns the value.
/// An `Err` ends the wait at once; after `within`, `TimedOut` (converted
/// into `E`). `check` runs at least once, even with `within` zero.
pub async fn try_eventually<T, E, F, Fut>(
    within: Duration,
    what: &str,
    mut check: F,
) -> Result<T, E>
where
    E: From<TimedOut>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    let give_up = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= give_up {
            return Err(TimedOut {
                what: what.to_owned(),
                within,
            }
            .into());
        }
        tokio::time::sleep(interval()).await;
    }
}

/// Checks `check` until it yields `Some`, and returns that.
///
/// # Panics
/// After `within`, saying `what` did not happen.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    try_eventually(within, what, || {
        let checked = check();
        async move { Ok::<_, TimedOut>(checked.await) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Checks `check` until it holds.
///
/// # Panics
/// After `within`, saying `what` did not happen.
pub async fn until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually(within, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// [`try_eventually`] on a plain thread (it sleeps the thread between checks).
pub fn blocking<T, E>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<Option<T>, E>,
) -> Result<T, E>
where
    E: From<TimedOut>,
{
    let give_up = std::time::Instant::now() + within;
    loop {
        if let Some(value) = check()? {
            return Ok(value);
        }
        if std::time::Instant::now() >= give_up {
            return Err(TimedOut {
                what: what.to_owned(),
                within,
            }
            .into());
        }
        std::thread::sleep(interval());
    }
}

/// [`until`] on a plain thread.
///
/// # Panics
/// After `within`, saying `what` did not happen.
pub fn blocking_until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    blocking(within, what, || Ok::<_, TimedOut>(check().then_some(())))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_value_and_stops_on_errors() {
        let mut calls = 0;
        let got: Result<u32, TimedOut> =
            try_eventually(Duration::from_secs(5), "three calls", || {
                calls += 1;
                let n = calls;
                async move { Ok((n == 3).then_some(n)) }
            })
            .await;
        assert_eq!(got, Ok(3));
        let failed: Result<(), std::io::Error> =
            try_eventually(Duration::from_secs(5), "never", || async {
                Err(std::io::Error::other("broken"))
            })
            .await;
        assert_eq!(failed.unwrap_err().to_string(), "broken");
    }

    #[tokio::test]
    async fn gives_up_after_within_and_says_what() {
        let started = tokio::time::Instant::now();
        let within = Duration::from_millis(50);
        let err =
            try_eventually::<(), TimedOut, _, _>(within, "the impossible", || async { Ok(None) })
                .await
                .unwrap_err();
        assert!(started.elapsed() >= within);
        assert_eq!(err.to_string(), "the impossible did not happen within 50ms");
        let err: std::io::Error = blocking(within, "nothing", || Ok::<Option<()>, TimedOut>(None))
            .unwrap_err()
            .into();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }
}
