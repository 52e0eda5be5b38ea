//! A connect that cannot work fails within the connect timeout with an
//! error that names the server and the cause: nothing listening, wrong or
//! missing credentials, TLS spoken to a plain-text port, a server that
//! accepts connections and never answers. And the URL's options reach the
//! server: a password from a file, the database, the key prefix, the
//! timeouts.

use std::time::Duration;

use crate::support::{LONG, private, rand_u64, raw, scaled, take, unique};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::redis::Options;
#[cfg(feature = "tls")]
use lock_conformance::kit::stores::redis::Tls;
use lock_redis::redis;
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::{LockBackend, LockError};
use tokio::time::Instant;

/// The connect timeout these tests set.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Connects with `url` and [`CONNECT_TIMEOUT`]; the error, the whole
/// message (every source included) and how long it took.
async fn failed_connect(url: &str) -> (LockError, String, Duration) {
    let config = RedisConfig::from_url(url)
        .unwrap()
        .connect_timeout(CONNECT_TIMEOUT);
    let started = Instant::now();
    let err = RedisBackend::connect_with(config)
        .await
        .expect_err("this connect cannot work");
    let took = started.elapsed();
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause}"));
        source = cause.source();
    }
    (err, text, took)
}

/// Within the connect timeout, allowing for scheduling.
fn within_the_connect_timeout(took: Duration, what: &str) {
    let bound = CONNECT_TIMEOUT + scaled(Duration::from_millis(250));
    assert!(took <= bound, "{what}: took {took:?}, more than {bound:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_says_connection_refused_at_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("redis://127.0.0.1:{port}");
    let (err, text, took) = failed_connect(&endpoint).await;
    assert!(err.is_retryable(), "a server may come up: {err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains(&endpoint) && shown.contains("connection refused"),
        "names the server and the cause: {shown}"
    );
    assert!(text.contains("refused"), "{text}");
    within_the_connect_timeout(took, "closed port");
    println!("closed port: {took:?}: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_say_authentication_at_once() {
    let store = private(Options::durable()).await;
    let mut con = raw(&store.url()).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("right-pw-123")
        .query_async(&mut con)
        .await
        .unwrap();
    let addr = store.addr();
    let endpoint = format!("redis://{addr}");
    for (url, cause) in [
        (
            format!("redis://:wrong-pw-789@{addr}"),
            "authentication failed: wrong user name or password",
        ),
        (
            format!("redis://nobody:wrong-pw-789@{addr}"),
            "authentication failed: wrong user name or password",
        ),
        (endpoint.clone(), "requires a password and none was given"),
    ] {
        let (err, text, took) = failed_connect(&url).await;
        assert!(
            matches!(err, LockError::Store { .. }) && !err.is_retryable(),
            "{url}: retrying cannot fix credentials: {err:?}"
        );
        let shown = err.to_string();
        assert!(
            shown.contains(&endpoint) && shown.contains(cause),
            "{url}: names the server and the cause: {shown}"
        );
        assert!(!text.contains("wrong-pw-789"), "{text}");
        within_the_connect_timeout(took, &url);
        println!("{}: {took:?}: {shown}", url.replace("wrong-pw-789", "***"));
    }
}

/// `rediss://` to a plain-text port: the server never answers the TLS
/// hello (it waits for a line of text), so only the timeout can end it;
/// the error then says the port accepts connections but speaks no TLS.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_text_port_says_so_within_the_connect_timeout() {
    let store = private(Options::durable()).await;
    let url = format!("rediss://{}", store.addr());
    let (err, _, took) = failed_connect(&url).await;
    assert!(err.is_retryable(), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains(&url) && shown.contains("plain-text Redis (then use redis://)"),
        "{shown}"
    );
    within_the_connect_timeout(took, "TLS to plain text");
    println!("TLS to a plain-text port: {took:?}: {shown}");
}

/// `redis://` to a TLS-only port: the server hangs up on the plain-text
/// hello at once, and the error says what that means.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_text_to_a_tls_port_says_so_at_once() {
    let ca = lock_conformance::kit::pki::TestCa::new("connect-errors CA");
    let server = ca.server();
    let tls = Tls::new(server.cert, server.key, ca.pem());
    let store = private(Options::default().tls(tls)).await;
    let url = format!("redis://{}", store.addr());
    let (err, _, took) = failed_connect(&url).await;
    assert!(err.is_retryable(), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains(&url) && shown.contains("a TLS-only port needs rediss://"),
        "{shown}"
    );
    within_the_connect_timeout(took, "plain text to TLS");
    println!("plain text to a TLS-only port: {took:?}: {shown}");
}

/// A server that accepts connections and says nothing (stalled, or not
/// Redis): the error says so, within the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_named_as_such_within_the_connect_timeout() {
    let store = private(Options::durable()).await;
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    proxy.set(Mode::Blackhole);
    let url = format!("redis://{}", proxy.addr());
    let (err, _, took) = failed_connect(&url).await;
    assert!(err.is_retryable(), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains(&url)
            && shown.contains("accepts TCP connections, but the server did not answer"),
        "{shown}"
    );
    within_the_connect_timeout(took, "silent server");
}

/// `password_file`, the database as the path, `prefix` and `timeout` in
/// the URL: the lock lands under that prefix in that database of a server
/// that wants that password, and the backend declares that timeout; a
/// `connect_timeout` in the URL bounds a connect to a silent server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_options_reach_the_server() {
    let store = private(Options::durable()).await;
    let mut con = raw(&store.url()).await;
    let password = format!("pw-{:x}", rand_u64());
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(&password)
        .query_async(&mut con)
        .await
        .unwrap();
    let file = std::env::temp_dir().join(format!("lock-redis-pw-{:x}", rand_u64()));
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let prefix = format!("opt{:x}:", rand_u64());
    let url = format!(
        "redis://{}/3?password_file={}&prefix={prefix}&timeout=750ms&connect_timeout=2s",
        store.addr(),
        file.display()
    );
    let backend = RedisBackend::connect(&url).await.unwrap();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(
        backend.capabilities().eviction_notice,
        Some(Duration::from_millis(750)),
        "the response timeout is the declared notice"
    );
    let name = unique("url-options");
    let lease = take(&backend, &name, LONG).await;
    let db = |n: u8| {
        let url = format!("redis://:{password}@{}/{n}", store.addr());
        async move { raw(&url).await }
    };
    let lock_key = format!("{prefix}{{{}}}", name.as_str());
    let (mut three, mut zero) = (db(3).await, db(0).await);
    let in_three: Option<String> = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut three)
        .await
        .unwrap();
    let in_zero: Option<String> = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut zero)
        .await
        .unwrap();
    assert!(
        in_three.is_some_and(|v| v.starts_with(&format!("{}:", lease.owner().encode()))),
        "the lock is under the URL's prefix in database 3"
    );
    assert_eq!(in_zero, None, "and not in database 0");
    backend.release(&lease).await.unwrap();

    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    proxy.set(Mode::Blackhole);
    let started = Instant::now();
    let err = RedisBackend::connect(&format!("redis://{}?connect_timeout=300ms", proxy.addr()))
        .await
        .expect_err("a silent server");
    let took = started.elapsed();
    assert!(err.to_string().contains("within 300ms"), "{err}");
    let bound = Duration::from_millis(300) + scaled(Duration::from_millis(250));
    assert!(took <= bound, "took {took:?}, more than {bound:?}");
}
