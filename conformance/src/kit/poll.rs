//! Waiting for a condition in adapter tests: poll it every 10 ms and panic
//! with what was awaited once the time is up (never sleep-and-hope).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Polls `check` until it yields `Some`, and returns that; panics after
/// `within` saying `what` did not happen.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let give_up = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < give_up,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `check` until it holds; panics after `within` saying `what` did
/// not happen.
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
