//! Small things every adapter needs, written once: bounding a request by a
//! timeout, retrying a cleanup in the background, showing a store URL
//! without its secrets, refusing a semaphore of no permits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::request::{Kind, LockRequest};
use crate::{LockError, LockName};

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

/// `url` fit for logs, errors, `Debug` and the CLI: never shows a secret,
/// whatever the input. The one redaction every crate of distlock uses.
///
/// - The user info is everything up to the **last** `@`: a password may
///   hold an unescaped `/`, `?`, `#`, `@` or `:`. Only the user name (up to
///   its first `:`) is kept; the rest becomes `***`.
/// - The value of a query parameter whose name speaks of a secret
///   (`password`, `pass`, `pwd`, `secret`, `token`, `auth`, `credential`,
///   `apikey`) and everything after it becomes `***`; so does a fragment.
/// - Text that is not `scheme://...` (a libpq `host=.. password=..` string,
///   a one-slash typo) shows only its scheme word, if it has one, and its
///   length.
///
/// ```
/// use lockcore::backend::redact_url;
/// assert_eq!(redact_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
/// assert_eq!(redact_url("redis://u:se#c/r?e@t@h:1/0"), "redis://u:***@h:1/0");
/// assert_eq!(redact_url("postgres://h/db?x=1&password=secret"), "postgres://h/db?x=1&password=***");
/// assert_eq!(redact_url("zk://h:2181/locks"), "zk://h:2181/locks");
/// assert_eq!(redact_url("redis:/u:secret@h"), "redis:<11 bytes hidden: not scheme://...>");
/// ```
pub fn redact_url(url: &str) -> String {
    let scheme_len = url
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .unwrap_or(url.len());
    let (scheme, after) = url.split_at(scheme_len);
    let Some(rest) = after.strip_prefix("://").filter(|_| !scheme.is_empty()) else {
        // Not a URL: show no part of it past a scheme word, it may hold a
        // password anywhere.
        let hidden = url.len() - scheme.len();
        return match after.strip_prefix(':') {
            Some(_) if !scheme.is_empty() => {
                format!("{scheme}:<{} bytes hidden: not scheme://...>", hidden - 1)
            }
            _ => format!("<{} bytes, not a URL>", url.len()),
        };
    };
    // First, everything from the value of the first secret query parameter
    // on is hidden: the value may hold an unescaped `&`, `#` or `@` that
    // would otherwise pass for more pairs, a fragment or the user info's end.
    let (rest, secret_cut) = match first_secret_value(rest) {
        Some(at) => (&rest[..at], "***"),
        None => (rest, ""),
    };
    // An `@` is the end of the user info only if no `/`, `?` or `#` comes
    // before the user name's `:` (else it is in the path, query or fragment).
    let userinfo_end = rest.rfind('@').filter(|&at| {
        let userinfo = &rest[..at];
        match (userinfo.find(['/', '?', '#']), userinfo.find(':')) {
            (Some(delimiter), Some(colon)) => colon < delimiter,
            (Some(_), None) => false,
            (None, _) => true,
        }
    });
    let (authority, tail) = match userinfo_end {
        Some(at) => {
            let (userinfo, host_and_tail) = (&rest[..at], &rest[at + 1..]);
            let end = host_and_tail
                .find(['/', '?', '#'])
                .unwrap_or(host_and_tail.len());
            let (host, tail) = host_and_tail.split_at(end);
            let authority = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => format!("{userinfo}@{host}"),
            };
            (authority, tail)
        }
        None => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            (rest[..end].to_owned(), &rest[end..])
        }
    };
    let (tail, fragment) = match tail.split_once('#') {
        Some((tail, _)) => (tail, "#***"),
        None => (tail, secret_cut),
    };
    format!("{scheme}://{authority}{tail}{fragment}")
}

/// Where the value of the first query parameter whose name speaks of a
/// secret starts (a name right after a `?` or `&`, up to its `=`).
fn first_secret_value(rest: &str) -> Option<usize> {
    rest.match_indices(['?', '&']).find_map(|(at, _)| {
        let pair = &rest[at + 1..];
        let eq = pair.find('=')?;
        let key = &pair[..eq];
        (!key.contains(['&', '?', '#', '/', '@']) && names_a_secret(key)).then_some(at + 1 + eq + 1)
    })
}

/// Whether a query parameter's name says its value is a secret.
fn names_a_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "auth",
        "credential",
        "apikey",
        "api_key",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// [`Cleanups::retry`](crate::backend::Cleanups::retry) on clean-ups of
/// its own, which nothing waits for: prefer the client's
/// [`Cleanups`](crate::backend::Cleanups), which `close` finishes.
#[deprecated(note = "spawn through the client's `Cleanups`, which `close` waits for")]
pub fn retry_in_background<T, F, Fut>(
    target: Arc<T>,
    until: Instant,
    what: &'static str,
    cleanup: F,
) where
    T: Send + Sync + 'static,
    F: FnMut(Arc<T>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), LockError>> + Send + 'static,
{
    crate::cleanups::Cleanups::new().retry(target, until, what, cleanup);
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

/// Checks a batch for [`LockBackend::try_acquire_each`](crate::LockBackend::try_acquire_each)
/// before any I/O: locks only, at least one, each name once (two grants of
/// one name in one store operation would replace each other).
///
/// # Errors
/// [`LockError::InvalidConfig`] saying what is wrong.
pub fn check_each(requests: &[LockRequest]) -> Result<(), LockError> {
    if requests.is_empty() {
        return Err(LockError::config("a multi-lock needs at least one name"));
    }
    let mut names = std::collections::HashSet::with_capacity(requests.len());
    for request in requests {
        if request.kind() != Kind::Lock {
            return Err(LockError::config(format!(
                "a multi-lock takes locks only: {} was asked as a {:?}",
                request.name(),
                request.kind()
            )));
        }
        if !names.insert(request.name()) {
            return Err(LockError::config(format!(
                "lock \"{}\" is named twice: a multi-lock takes each name once",
                request.name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_distinct_locks() {
        let request = |name: &str| {
            let ttl = crate::Capabilities::new("test")
                .effective_ttl(std::time::Duration::from_secs(1))
                .unwrap();
            LockRequest::new(LockName::new(name).unwrap(), ttl)
        };
        assert!(check_each(&[request("a"), request("b")]).is_ok());
        for bad in [
            vec![],
            vec![request("a"), request("a")],
            vec![request("a"), request("b").with_permits(2)],
            vec![request("a").with_access(crate::Access::Read)],
        ] {
            assert!(
                matches!(check_each(&bad), Err(LockError::InvalidConfig { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn secrets_never_show() {
        for (url, shown) in [
            ("redis://u:secret@h:1/0", "redis://u:***@h:1/0"),
            ("rediss://:secret@h", "rediss://:***@h"),
            ("redis://h:1", "redis://h:1"),
            ("etcds://user@h:2379", "etcds://user@h:2379"),
            (
                "postgres://h/db?password=secret&user=a",
                "postgres://h/db?password=***",
            ),
            ("postgres://a:p@w@h/db", "postgres://a:***@h/db"),
            ("redis://u:a/b?c#d@h:1/0", "redis://u:***@h:1/0"),
            ("redis://u:a#b@h:1/0?x=1", "redis://u:***@h:1/0?x=1"),
            ("redis://h:1/0?x=a:b@c", "redis://h:***@c"),
            (
                "etcd://h:1/p?x=1&token=abc&auth=x:y",
                "etcd://h:1/p?x=1&token=***",
            ),
            ("zk://h/root#frag", "zk://h/root#***"),
            (
                "postgres://u@h:1/db?password=a#b@c",
                "postgres://u@h:1/db?password=***",
            ),
            (
                "postgres://u@h:1/db?x=1&Password=a&b@c:d",
                "postgres://u@h:1/db?x=1&Password=***",
            ),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        for not_a_url in [
            "secret-not-a-url",
            "host=h password=secret",
            "redis:/u:secret@h",
            "redis:u:secret@h",
            "://u:secret@h",
            "",
        ] {
            assert!(!redact_url(not_a_url).contains("secret"), "{not_a_url}");
        }
        assert_eq!(
            redact_url("redis:/u:secret@h"),
            "redis:<11 bytes hidden: not scheme://...>"
        );
    }

    #[test]
    fn a_password_of_any_awkward_characters_never_shows() {
        let awkward = ['#', '/', '?', '@', ':', '%', '&', '=', ' '];
        for a in awkward {
            for b in awkward {
                let marker = format!("MARK{a}ER{b}42");
                for url in [
                    format!("redis://user:{marker}@h:6379/0"),
                    format!("redis://:{marker}@h:6379"),
                    format!("postgres://u:{marker}@h:5432/db?sslmode=require"),
                    format!("postgres://h/db?password={marker}"),
                    format!("etcds://u:{marker}@h1:2379,h2:2379/prefix"),
                    format!("zk://u:{marker}@h:2181/root?session_timeout=4s"),
                    format!("redis:/u:{marker}@h"),
                    format!("host=h password={marker}"),
                    format!("postgres://u@h:1/db?password={marker}"),
                    format!("postgres://u@h:1/db?sslmode=require&password={marker}&x=1"),
                    format!("redis://u:{marker}@h:1/0?password={marker}"),
                ] {
                    let shown = redact_url(&url);
                    assert!(
                        !shown.contains("MARK") && !shown.contains("ER") && !shown.contains("42"),
                        "{url} -> {shown}"
                    );
                }
            }
        }
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
