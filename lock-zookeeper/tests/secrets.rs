//! Secrets never reach output: every connect and error path, driven with
//! digest credentials whose password is the kit's marker (`#/?@:%` between
//! two runs of letters), raw and percent-encoded. Errors (`Display` and
//! `Debug`), `Debug` of the configuration and of a connected backend, and
//! everything logged through `tracing` by the whole test binary must show no
//! part of it.

#[path = "store/support.rs"]
mod support;

use std::time::Duration;

use lock_conformance::kit::secrets::{self, MARKER, assert_hidden};
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError};
use support::unique;

/// The marker as written in a URL: raw (the user info ends at the last
/// `@`), and percent-encoded.
fn passwords() -> [String; 2] {
    [MARKER.to_owned(), secrets::encoded()]
}

/// The test client's options, short timeouts.
const OPTIONS: &str = "session_timeout=4s&tick_time=250ms&connect_timeout=2s";

fn hidden_error(what: &str, e: &LockError) {
    assert_hidden(&format!("{what}: the error"), &e.to_string());
    assert_hidden(&format!("{what}: the error's Debug"), &format!("{e:?}"));
}

/// Parses `url` and connects with it, expecting an error: neither shows the
/// marker; `Debug` of a configuration that parsed shows none either.
async fn refused(what: &str, url: &str) -> LockError {
    match ZooKeeperConfig::from_url(url) {
        Ok(config) => assert_hidden(
            &format!("{what}: Debug of the config"),
            &format!("{config:?}"),
        ),
        Err(e) => hidden_error(&format!("{what}: from_url"), &e),
    }
    if let Err(e) = url.parse::<ZooKeeperConfig>() {
        hidden_error(&format!("{what}: parse"), &e);
    }
    let e = ZooKeeperBackend::connect(url)
        .await
        .expect_err(&format!("{what}: connect succeeded"));
    hidden_error(&format!("{what}: connect"), &e);
    eprintln!("{what}: {e}");
    e
}

/// Malformed URLs (one slash, a bad or unknown option, an unknown scheme, a
/// bad port, an empty host, a fragment, a bad root, a libpq-style string),
/// and a closed port: `InvalidConfig` or `Unavailable`, showing nothing of
/// the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_and_a_closed_port_show_no_password() {
    secrets::capture_tracing();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for password in passwords() {
        for (what, url) in [
            ("one slash", format!("zk:/alice:{password}@{closed}/locks")),
            (
                "one slash, zookeeper",
                format!("zookeeper:/alice:{password}@{closed}"),
            ),
            ("no slash", format!("zk:alice:{password}@{closed}")),
            (
                "unknown option",
                format!("zk://alice:{password}@{closed}/locks?bogus=1"),
            ),
            (
                "bad duration",
                format!("zk://alice:{password}@{closed}/locks?session_timeout=soon"),
            ),
            (
                "option holding it",
                format!("zk://alice:{password}@{closed}/locks?session_timeout={password}"),
            ),
            (
                "unknown scheme",
                format!("zookeepr://alice:{password}@{closed}"),
            ),
            (
                "bad port",
                format!("zk://alice:{password}@127.0.0.1:x/locks"),
            ),
            ("empty host", format!("zk://alice:{password}@/locks")),
            (
                "fragment",
                format!("zk://alice:{password}@{closed}/locks#top"),
            ),
            ("bad root", format!("zk://alice:{password}@{closed}/a//b")),
            ("no user", format!("zk://{password}@{closed}/locks")),
            (
                "libpq style",
                format!(
                    "host=127.0.0.1 port={} user=alice password={password}",
                    closed.port()
                ),
            ),
            ("connect string", format!("alice:{password}@{closed}/locks")),
        ] {
            let e = refused(&format!("{what} ({password:?})"), &url).await;
            assert!(
                matches!(e, LockError::InvalidConfig { .. }),
                "{what}: {e:?}"
            );
        }
        let url = format!("zk://alice:{password}@{closed}/locks?{OPTIONS}");
        let e = refused("a closed port", &url).await;
        assert!(matches!(e, LockError::Unavailable { .. }), "{e:?}");
    }
    assert_hidden("the tracing output", &secrets::captured());
}

/// The builder: the password set with `digest`, and a URL-like string given
/// as the connect string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_builder_shows_no_password() {
    secrets::capture_tracing();
    let store = zookeeper::shared();
    for password in passwords() {
        let config = support::config(store.endpoint()).digest("alice", &password);
        assert_hidden("Debug of a built config", &format!("{config:?}"));
        for connect in [
            format!("alice:{password}@{}", store.addr()),
            format!("zk://alice:{password}@{}", store.addr()),
        ] {
            let config = ZooKeeperConfig::new(connect.as_str()).digest("alice", &password);
            assert_hidden("Debug of a config built from a URL", &format!("{config:?}"));
            let e = config.validate().unwrap_err();
            hidden_error("validate", &e);
            let e = ZooKeeperBackend::connect_with(config).await.unwrap_err();
            hidden_error("connect_with", &e);
        }
    }
    assert_hidden("the tracing output", &secrets::captured());
}

/// A private server that refuses clients without digest credentials, and
/// roots owned by identities: the marker password is refused where another
/// password of the same user owns the root (at connect, naming the owners
/// by user name only), as is a client without credentials; where it owns
/// the root, the backend connects, and its `Debug`, its work and its errors
/// show nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_store_refuses_wrong_credentials_without_showing_them() {
    secrets::capture_tracing();
    if !support::may_launch_servers("the_real_store_refuses_wrong_credentials") {
        return;
    }
    let store = tokio::task::spawn_blocking(|| {
        let mut options = zookeeper::Options::default();
        options.require_digest = true;
        zookeeper::start(options)
    })
    .await
    .unwrap()
    .unwrap();
    let addr = store.addr();
    let other = support::config(addr.to_string())
        .root("/owned")
        .digest("alice", "another-password");
    let owner = ZooKeeperBackend::connect_with(other).await.unwrap();
    let anonymous = format!("zk://{addr}/locks?{OPTIONS}");
    let e = refused("no credentials", &anonymous).await;
    assert!(!matches!(e, LockError::InvalidConfig { .. }), "{e:?}");
    for password in passwords() {
        let url = format!("zk://alice:{password}@{addr}/owned?{OPTIONS}");
        let e = refused("another password's root", &url).await;
        assert!(
            e.to_string().contains("check the digest credentials")
                && e.to_string().contains("digest:alice"),
            "{e}"
        );

        let url = format!("zk://alice:{password}@{addr}/mine?{OPTIONS}");
        let backend = ZooKeeperBackend::connect(&url).await.unwrap();
        assert_hidden("Debug of the backend", &format!("{backend:?}"));
        assert_hidden("Debug of its config", &format!("{:?}", backend.config()));
        let name = unique("secret-holder");
        let lease = backend
            .try_acquire_for(&name, Duration::from_secs(4))
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert_hidden("Debug of a lease", &format!("{lease:?}"));
        let lease = backend.renew(&lease).await.unwrap();
        assert_hidden(
            "Debug of a holder",
            &format!("{:?}", backend.inspect(&name).await.unwrap()),
        );
        let floor = lockcore::FencingToken::new(u64::MAX).unwrap();
        hidden_error(
            "a floor refused",
            &backend.raise_fence_floor(floor).await.unwrap_err(),
        );
        let client = backend.client().unwrap();
        let written = lock_zookeeper::fenced_write(&client, "bad path", lease.fence(), |_| Ok(()));
        hidden_error("a fenced write refused", &written.await.unwrap_err());
        drop(client);
        backend.release(&lease).await.unwrap();
        backend.close().await.unwrap();
        let e = backend
            .try_acquire_for(&name, Duration::from_secs(4))
            .await
            .unwrap_err();
        hidden_error("a closed backend", &e);
    }
    owner.close().await.unwrap();
    assert_hidden("the tracing output", &secrets::captured());
}

/// SASL (`auth=sasl`) with the marker as the password: a server that
/// requires SASL and knows it lets the client in, and its `Debug`, its
/// work and the log show nothing of it; a server that knows another
/// password refuses it, and the error shows nothing of it either.
#[cfg(feature = "sasl")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_credentials_are_never_shown() {
    secrets::capture_tracing();
    if !support::may_launch_servers("sasl_credentials_are_never_shown") {
        return;
    }
    let launch = |password: &'static str| {
        tokio::task::spawn_blocking(move || {
            zookeeper::start(zookeeper::Options::default().require_sasl("alice", password))
        })
    };
    let knows = launch(MARKER).await.unwrap().unwrap();
    let other = launch("another-password").await.unwrap().unwrap();
    for password in passwords() {
        let url = format!(
            "zk://alice:{password}@{}/sasl?auth=sasl&{OPTIONS}",
            other.addr()
        );
        let e = refused("another password", &url).await;
        assert!(e.to_string().contains("authentication failed"), "{e}");

        let url = format!(
            "zk://alice:{password}@{}/sasl?auth=sasl&{OPTIONS}",
            knows.addr()
        );
        let backend = ZooKeeperBackend::connect(&url).await.unwrap();
        assert_hidden("Debug of the backend", &format!("{backend:?}"));
        assert_hidden("Debug of its config", &format!("{:?}", backend.config()));
        let name = unique("sasl-secret-holder");
        let lease = backend
            .try_acquire_for(&name, Duration::from_secs(4))
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert_hidden("Debug of a lease", &format!("{lease:?}"));
        backend.release(&lease).await.unwrap();
        backend.close().await.unwrap();
    }
    assert_hidden("the tracing output", &secrets::captured());
}
