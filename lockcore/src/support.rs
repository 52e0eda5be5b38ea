//! Small things every adapter needs, written once: bounding a request by a
//! timeout, retrying a cleanup in the background, showing a store URL
//! without its secrets, refusing a semaphore of no permits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Backoff, LockError, LockName};

/// Runs `request` for at most `limit`. A request that gets no answer in time
/// is [`LockError::Unavailable`] (retryable: every operation is
/// owner-checked), saying what it was and how long it waited.
///
/// # Errors
/// The request's own error, or the timeout.
pub async fn timed<T>(
    backend: &'static str,
    what: &str,
    limit: Duration,
    request: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result,
        Err(_) => Err(LockError::unavailable(
            backend,
            format!("{what} got no answer within {limit:?}"),
        )),
    }
}

/// `url` fit for logs, errors and `Debug`: a password in the user info or in
/// a `password` query parameter becomes `***`; text that is not a URL is cut
/// to its scheme. Never shows a secret, whatever the input.
///
/// ```
/// use lockcore::backend::redact_url;
/// assert_eq!(redact_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
/// assert_eq!(redact_url("postgres://h/db?password=secret&x=1"), "postgres://h/db?password=***&x=1");
/// assert_eq!(redact_url("zk://h:2181/locks"), "zk://h:2181/locks");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL: show no part of it, it may hold a password.
        return format!("<{} bytes, not a URL>", url.len());
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{user}:***@{host}")
        }
        _ => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Runs `cleanup` on `target` in the background (undoing an acquire whose
/// reply was lost, leaving a line), retried with jittered backoff while it
/// fails with a retryable error, until `until` (when whatever it would undo
/// has expired anyway) or `target` is dropped. The first try holds `target`,
/// later ones only if it is still alive. Without a runtime nothing runs:
/// the leftover expires. A permanent error is logged at DEBUG with `what`.
pub fn retry_in_background<T, F, Fut>(
    target: Arc<T>,
    until: Instant,
    what: &'static str,
    mut cleanup: F,
) where
    T: Send + Sync + 'static,
    F: FnMut(Arc<T>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), LockError>> + Send,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(&target);
    let mut first = Some(target);
    runtime.spawn(async move {
        let retry = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        for attempt in 0_u32.. {
            let Some(target) = first.take().or_else(|| weak.upgrade()) else {
                return;
            };
            match cleanup(target).await {
                Ok(()) => return,
                Err(e) if e.is_retryable() => {
                    let next = Instant::now() + retry.delay(attempt);
                    if next >= until {
                        return;
                    }
                    tokio::time::sleep_until(next).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "{what} failed; what it would undo expires");
                    return;
                }
            }
        }
    });
}

/// Refuses a semaphore of zero permits before any I/O: it could never be
/// acquired, and storing 0 as the agreed count would refuse every later
/// holder that asks for a real one.
///
/// # Errors
/// [`LockError::InvalidConfig`] naming the semaphore.
pub fn check_permits(name: &LockName, permits: u32) -> Result<(), LockError> {
    if permits == 0 {
        return Err(LockError::config(format!(
            "semaphore \"{name}\" needs at least one permit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_show() {
        for (url, shown) in [
            ("redis://u:secret@h:1/0", "redis://u:***@h:1/0"),
            ("rediss://:secret@h", "rediss://:***@h"),
            ("redis://h:1", "redis://h:1"),
            ("etcds://user@h:2379", "etcds://user@h:2379"),
            (
                "postgres://h/db?password=secret&user=a",
                "postgres://h/db?password=***&user=a",
            ),
            ("postgres://a:p@w@h/db", "postgres://a:***@h/db"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        assert!(!redact_url("secret-not-a-url").contains("secret"));
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_say_what_and_how_long() {
        let err = timed("store", "renew", Duration::from_secs(2), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), LockError>(())
        })
        .await
        .unwrap_err();
        assert!(err.is_retryable());
        assert!(
            err.to_string().contains("renew got no answer within 2s"),
            "{err}"
        );
    }
}
