//! The password never reaches anything the adapter prints or returns: every
//! connect and error path, driven with a password full of the characters
//! URLs treat specially (`kit::secrets::MARKER`), raw and percent-encoded,
//! against a closed port, a private etcd with authentication (the right
//! password and a wrong one), malformed URLs and the config builder. The
//! error's `Display` and `Debug`, the config's and the backend's `Debug`, and
//! everything logged through `tracing` at any level must not show it.

// The stores' test helpers, shared with the `store` binary.
#[path = "store/support.rs"]
mod support;

use std::time::Duration;

use lock_conformance::kit::secrets::{self, MARKER};
use lock_conformance::kit::stores::etcd;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError};
use support::*;

/// What was shown, for the failure message.
fn hidden(what: &str, text: &str) {
    secrets::assert_hidden(what, text);
}

fn check_error(what: &str, e: &LockError) {
    hidden(&format!("{what}: the error"), &e.to_string());
    hidden(&format!("{what}: the error's Debug"), &format!("{e:?}"));
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        hidden(&format!("{what}: a cause"), &cause.to_string());
        source = cause.source();
    }
}

/// Connects with `config`, bounded; checks whatever comes out. `Some` on
/// success.
async fn connect_checked(what: &str, config: EtcdConfig) -> Option<EtcdBackend> {
    hidden(
        &format!("{what}: the config's Debug"),
        &format!("{config:?}"),
    );
    hidden(
        &format!("{what}: the config's Debug"),
        &format!("{config:#?}"),
    );
    let outcome = tokio::time::timeout(
        scaled(Duration::from_secs(20)),
        EtcdBackend::connect_with(config),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: connect hung"));
    match outcome {
        Ok(backend) => {
            hidden(
                &format!("{what}: the backend's Debug"),
                &format!("{backend:?}"),
            );
            Some(backend)
        }
        Err(e) => {
            check_error(what, &e);
            None
        }
    }
}

/// Parses `url` and connects with it (the path `EtcdBackend::connect`
/// takes), checking every output; `Some` on success.
async fn url_checked(what: &str, url: &str) -> Option<EtcdBackend> {
    let parsed = EtcdConfig::from_url(url);
    match parsed {
        Err(e) => {
            check_error(&format!("{what}: from_url"), &e);
            assert!(
                matches!(e, LockError::InvalidConfig { .. }),
                "{what}: a bad URL must be InvalidConfig: {}",
                lockcore::backend::redact_url(url)
            );
            let direct = EtcdBackend::connect(url).await;
            match direct {
                Err(e) => check_error(&format!("{what}: connect"), &e),
                Ok(backend) => panic!("{what}: connect took a URL from_url refused: {backend:?}"),
            }
            None
        }
        Ok(config) => connect_checked(what, config).await,
    }
}

/// Uses a connected backend once and closes it.
async fn exercise(what: &str, backend: EtcdBackend) {
    let lock = name("secrets");
    let lease = acquire(&backend, &lock, Duration::from_secs(5)).await;
    let held = backend.inspect(&lock).await.unwrap();
    hidden(&format!("{what}: inspect"), &format!("{held:?}"));
    backend.release(&lease).await.unwrap();
    backend.close().await.unwrap();
    let refused = backend.try_acquire_for(&lock, Duration::from_secs(5)).await;
    if let Err(e) = &refused {
        check_error(&format!("{what}: after close"), e);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_never_reaches_errors_debug_or_logs() {
    secrets::capture_tracing();
    let store =
        tokio::task::spawn_blocking(|| etcd::start(etcd::Options::default().root_password(MARKER)))
            .await
            .unwrap()
            .expect("a private etcd with auth");
    let live = store.addr();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let mut connected = 0;
    for (form, password) in [("raw", MARKER.to_owned()), ("encoded", secrets::encoded())] {
        let at = |userinfo: &str, rest: &str| format!("etcd://{userinfo}@{rest}");
        let right = format!("root:{password}");
        let wrong = format!("root:{password}x");
        let cases = [
            ("the right password", at(&right, &live.to_string())),
            ("a wrong password", at(&wrong, &live.to_string())),
            (
                "an unknown user",
                at(&format!("nobody:{password}"), &live.to_string()),
            ),
            ("a closed port", at(&right, &closed.to_string())),
            ("one slash", format!("etcd:/{right}@{live}")),
            ("no scheme", format!("{right}@{live}")),
            ("another scheme", format!("redis://{right}@{live}")),
            (
                "a bad option",
                format!("{}?nope=1", at(&right, &live.to_string())),
            ),
            (
                "a bad timeout",
                format!("{}?timeout=x", at(&right, &live.to_string())),
            ),
            ("no port", at(&right, "127.0.0.1")),
            ("an empty host", at(&right, "127.0.0.1:1,,127.0.0.1:2")),
            (
                "a missing CA",
                format!("etcds://{right}@{live}?tls_ca=/nonexistent/ca.pem"),
            ),
            (
                "a missing CA, by its old name (logged with a warning)",
                format!("etcds://{right}@{live}?ca=/nonexistent/ca.pem"),
            ),
            (
                "a prefix",
                format!("{}/app%2F/", at(&right, &live.to_string())),
            ),
            (
                "a libpq-style string",
                format!(
                    "host=127.0.0.1 port={} user=root password={password}",
                    live.port()
                ),
            ),
        ];
        for (case, url) in cases {
            let what = format!("{case} ({form})");
            if let Some(backend) = url_checked(&what, &url).await {
                connected += 1;
                exercise(&what, backend).await;
            }
        }
        // The config builder, with the password given apart, and inside an
        // endpoint where it does not belong.
        let builder = [
            (
                "builder, the right password",
                EtcdConfig::new([format!("http://{live}")]).user("root", MARKER),
            ),
            (
                "builder, a wrong password",
                EtcdConfig::new([format!("http://{live}")]).user("root", format!("{MARKER}x")),
            ),
            (
                "builder, a closed port",
                EtcdConfig::new([format!("http://{closed}")]).user("root", MARKER),
            ),
            (
                "builder, a password in the endpoint",
                EtcdConfig::new([format!("http://root:{password}@{live}")]),
            ),
            (
                "builder, a password in a bare endpoint",
                EtcdConfig::new([format!("root:{password}@{live}")]),
            ),
        ];
        for (case, config) in builder {
            let what = format!("{case} ({form})");
            if let Err(e) = config.validate() {
                check_error(&format!("{what}: validate"), &e);
            }
            if let Some(backend) = connect_checked(&what, config).await {
                connected += 1;
                exercise(&what, backend).await;
            }
        }
    }
    // The right password, in each form, through the URL and the builder.
    assert_eq!(
        connected, 6,
        "every right password connected: the test covered success"
    );
    let logged = secrets::captured();
    assert!(
        !logged.is_empty(),
        "nothing was captured: the check below shows nothing"
    );
    hidden("the tracing output", &logged);
}
