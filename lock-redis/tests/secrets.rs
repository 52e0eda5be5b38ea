//! A password never reaches anything this crate prints or returns: errors
//! (Display, Debug, every source), `Debug` of configs and backends, and
//! whatever it logs. Every connect and error path is driven with URLs whose
//! password is the kit's marker (`#/?@:%` between two runs of letters), as
//! typed and percent-encoded: a closed port, a silent one, the real server
//! with wrong and right credentials, a server refused for its settings,
//! malformed URLs, bad options, and the config builder.

#[path = "store/support.rs"]
mod support;

use std::error::Error;
use std::time::Duration;

use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::secrets::{self, MARKER, assert_hidden};
use lock_conformance::kit::stores::redis::{Options, Persistence};
use lock_redis::redis;
use lock_redis::{RedisBackend, RedisConfig};
use lockcore::backend::LockBackendExt;
use lockcore::{LockBackend, LockError};
use support::{LONG, private, raw, unique};

/// The marker as typed into a URL, and percent-encoded.
fn passwords() -> [String; 2] {
    [MARKER.to_owned(), secrets::encoded()]
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Everything an error shows: Display, Debug, and each source's.
fn everything(err: &LockError) -> String {
    let mut text = format!("{err}\n{err:?}");
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!("\n{cause}\n{cause:?}"));
        source = cause.source();
    }
    text
}

fn check_error(what: &str, err: &LockError) {
    assert_hidden(&format!("{what}: the error"), &everything(err));
}

/// Parses `url` and connects with it, both ways (`connect` and
/// `from_url` + `connect_with`), checking every text on the way; the
/// backend, if it connected.
async fn drive(what: &str, url: &str) -> Option<RedisBackend> {
    let plain = RedisBackend::connect(url).await;
    match &plain {
        Err(e) => check_error(&format!("{what}: connect"), e),
        Ok(backend) => assert_hidden(
            &format!("{what}: Debug of the backend"),
            &format!("{backend:?}"),
        ),
    }
    let config = match RedisConfig::from_url(url) {
        Ok(config) => config,
        Err(e) => {
            check_error(&format!("{what}: from_url"), &e);
            return None;
        }
    };
    assert_hidden(
        &format!("{what}: Debug of the config"),
        &format!("{config:?}"),
    );
    // A changed config, Debug-checked again. The default timeout, scaled:
    // a TLS connect with the right password to a loaded server can take
    // longer than a shorter one, and must succeed.
    let timeout = RedisConfig::DEFAULT_CONNECT_TIMEOUT.mul_f64(lock_conformance::kit::time_scale());
    let config = config.connect_timeout(timeout);
    assert_hidden(
        &format!("{what}: Debug of the config"),
        &format!("{config:?}"),
    );
    match RedisBackend::connect_with(config).await {
        Ok(backend) => {
            assert_hidden(
                &format!("{what}: Debug of the backend"),
                &format!("{backend:?}"),
            );
            Some(backend)
        }
        Err(e) => {
            check_error(&format!("{what}: connect_with"), &e);
            None
        }
    }
}

/// Nothing logged by the test binary so far shows the marker.
fn logs_are_clean() {
    assert_hidden("the captured tracing output", &secrets::captured());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers() {
    secrets::capture_tracing();
    let closed = closed_port();
    let proxy = FaultProxy::start(format!("127.0.0.1:{closed}").parse().unwrap())
        .await
        .unwrap();
    proxy.set(Mode::Blackhole);
    let silent = proxy.addr();
    for pw in passwords() {
        for url in [
            format!("redis://user:{pw}@127.0.0.1:{closed}/0"),
            format!("redis://:{pw}@127.0.0.1:{closed}"),
            format!("rediss://user:{pw}@127.0.0.1:{closed}/0"),
            format!("redis://user:{pw}@{silent}/0"),
            format!("redis+unix:///nonexistent/redis.sock?db=1&pass={pw}"),
            format!("redis+unix://user:{pw}@/nonexistent/redis.sock"),
        ] {
            assert!(drive(&url, &url).await.is_none(), "{url} connected");
        }
    }
    logs_are_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_and_bad_options() {
    secrets::capture_tracing();
    let closed = closed_port();
    for pw in passwords() {
        for url in [
            format!("redis:/user:{pw}@127.0.0.1:{closed}/0"),
            format!("redis:user:{pw}@127.0.0.1:{closed}"),
            format!("redis//user:{pw}@127.0.0.1:{closed}"),
            format!("user:{pw}@127.0.0.1:{closed}"),
            format!("http://user:{pw}@127.0.0.1:{closed}"),
            format!("redis://user:{pw}@127.0.0.1:notaport/0"),
            format!("redis://user:{pw}@127.0.0.1:{closed}/notadb"),
            format!("redis://user:{pw}@127.0.0.1:{closed}/0?allow_maxmemory_eviction=maybe"),
            format!("redis://user:{pw}@127.0.0.1:{closed}/0?protocol=resp9"),
            format!("redis://user:{pw}@[::1/0"),
            format!("redis://user:{pw}@"),
            format!("host=127.0.0.1 port={closed} password={pw}"),
            format!("redis://127.0.0.1:{closed}/0?password={pw}"),
        ] {
            assert!(drive(&url, &url).await.is_none(), "{url} connected");
        }
    }
    // The encoded marker as a bad flag value: the URL parses, the value is
    // refused, and not echoed. (The raw marker there makes the URL unparsable,
    // and a secret given as a non-secret parameter's value is shown by any
    // redaction.)
    let url = format!(
        "redis://127.0.0.1:{closed}/0?allow_maxmemory_eviction={}",
        secrets::encoded()
    );
    assert!(drive(&url, &url).await.is_none(), "{url} connected");
    logs_are_clean();
}

/// The builder: options that are refused at connect, another address, and
/// a client built by the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_builder() {
    secrets::capture_tracing();
    let closed = closed_port();
    for pw in passwords() {
        let url = format!("redis://user:{pw}@127.0.0.1:1/2");
        let Ok(config) = RedisConfig::from_url(&url) else {
            continue; // the raw marker may not parse: checked elsewhere
        };
        let moved = config.clone().address("127.0.0.1", closed);
        assert_hidden("Debug after address()", &format!("{moved:?}"));
        for (what, bad) in [
            ("a bad prefix", moved.clone().key_prefix("a{b")),
            (
                "a zero timeout",
                moved.clone().response_timeout(Duration::ZERO),
            ),
            ("a closed port", moved.clone()),
        ] {
            assert_hidden(&format!("{what}: Debug"), &format!("{bad:?}"));
            let err = RedisBackend::connect_with(bad).await.unwrap_err();
            check_error(what, &err);
        }
        let client = redis::Client::open(format!("redis://user:{pw}@127.0.0.1:{closed}"));
        if let Ok(client) = client {
            let config = RedisConfig::from_client(client);
            assert_hidden("Debug of from_client", &format!("{config:?}"));
            let err = RedisBackend::connect_with(config).await.unwrap_err();
            check_error("from_client", &err);
        }
        #[cfg(feature = "tls")]
        {
            let pem = "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n";
            let err = config.clone().tls_root_cert_pem(pem).unwrap_err();
            check_error("TLS roots on a redis:// URL", &err);
        }
    }
    logs_are_clean();
}

/// The real server: the marker as a wrong password, as the right password of
/// an ACL user (who then locks, and fails where its ACL says no), and as the
/// password of a user refused for what it may not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_server_with_wrong_and_right_passwords() {
    secrets::capture_tracing();
    let store = private(Options::durable()).await;
    let addr = store.addr();
    let mut con = raw(&store.url()).await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("marked")
        .arg(&["on", &format!(">{MARKER}"), "~distlock:*", "&distlock:*"])
        .arg(&["+@all", "-@dangerous", "+info"])
        .query_async(&mut con)
        .await
        .unwrap();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("blind")
        .arg(&[
            "on",
            &format!(">{MARKER}"),
            "~*",
            "&*",
            "+@all",
            "-@dangerous",
        ])
        .query_async(&mut con)
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("the-admin-password")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut connected = 0;
    for pw in passwords() {
        for url in [
            format!("redis://:{pw}@{addr}"),
            format!("redis://default:{pw}@{addr}/0"),
            format!("redis://nobody:{pw}@{addr}"),
            format!("redis://blind:{pw}@{addr}"),
        ] {
            assert!(drive(&url, &url).await.is_none(), "{url} connected");
        }
        let url = format!("redis://marked:{pw}@{addr}");
        let Some(backend) = drive(&url, &url).await else {
            continue;
        };
        connected += 1;
        let lease = backend
            .try_acquire_for(&unique("marked"), LONG)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        backend.release(&lease).await.unwrap();
        let outside = RedisBackend::connect_with(
            RedisConfig::from_url(&url)
                .unwrap()
                .key_prefix("elsewhere:"),
        )
        .await
        .unwrap();
        let denied = outside
            .try_acquire_for(&unique("denied"), LONG)
            .await
            .unwrap_err();
        check_error("NOPERM on another prefix", &denied);
        assert_hidden("Debug of a lease", &format!("{lease:?}"));
        backend.close().await.unwrap();
        outside.close().await.unwrap();
    }
    assert!(connected >= 1, "the encoded marker is a usable password");
    logs_are_clean();
}

/// A server refused for its settings (an evicting policy): the refusal
/// names the server, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refused_for_its_settings() {
    secrets::capture_tracing();
    let store = private(
        Options::default()
            .persistence(Persistence::None)
            .server_args(["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]),
    )
    .await;
    let mut con = raw(&store.url()).await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg(&["on", &format!(">{MARKER}")])
        .query_async(&mut con)
        .await
        .unwrap();
    for pw in passwords() {
        let url = format!("redis://:{pw}@{}", store.addr());
        assert!(
            drive(&url, &url).await.is_none(),
            "an evicting server is refused"
        );
        let accepted = RedisConfig::from_url(&format!("{url}?allow_maxmemory_eviction=true"));
        if let Ok(config) = accepted {
            let durable = config.require_durable_fences(true);
            let err = RedisBackend::connect_with(durable).await.unwrap_err();
            check_error("durable fences required", &err);
        }
    }
    logs_are_clean();
}
