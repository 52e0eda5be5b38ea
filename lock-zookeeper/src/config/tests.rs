//! Parsing, checking and showing configurations: the URL's spellings, new
//! and old (with their warning), and errors that name what to fix without
//! showing a secret.

use lock_conformance::kit::secrets::{self, MARKER, assert_hidden};

use super::*;

/// The durations of a URL, in the one syntax: read, and nothing logged.
#[test]
fn durations_are_read_in_the_one_syntax() {
    let (config, log) = logged(&format!(
        "zk://{}:1/a?session_timeout=4s&tick_time=250ms&connection_timeout=1.5s&connect_timeout=1m&container_check_interval=100ms",
        host()
    ));
    let config = config.unwrap();
    assert_eq!(config.session_timeout, Duration::from_secs(4));
    assert_eq!(config.tick_time, Some(Duration::from_millis(250)));
    assert_eq!(config.connection_timeout, Some(Duration::from_millis(1500)));
    assert_eq!(config.connect_timeout, Duration::from_secs(60));
    assert_eq!(config.container_check_interval, Duration::from_millis(100));
    assert!(log.is_empty(), "{log}");
}

/// The forms read before this release (any `humantime` duration) still
/// work, each with a one-line warning naming the option and the syntax.
#[test]
fn old_duration_forms_still_work_and_warn() {
    for option in [
        "session_timeout",
        "tick_time",
        "connection_timeout",
        "connect_timeout",
        "container_check_interval",
    ] {
        for (old, expected) in [
            ("2sec", Duration::from_secs(2)),
            ("2minutes", Duration::from_secs(120)),
            ("1m%2030s", Duration::from_secs(90)),
        ] {
            let url = format!("zk://{}:1/a?{option}={old}", host());
            let (config, log) = logged(&url);
            let config = config.unwrap_or_else(|e| panic!("{url}: {e}"));
            let read = match option {
                "session_timeout" => Some(config.session_timeout),
                "tick_time" => config.tick_time,
                "connection_timeout" => config.connection_timeout,
                "container_check_interval" => Some(config.container_check_interval),
                _ => Some(config.connect_timeout),
            };
            assert_eq!(read, Some(expected), "{url}");
            assert_eq!(log.lines().count(), 1, "{url}: {log}");
            assert!(
                log.contains("WARN")
                    && log.contains(&format!("URL option {option}: write the duration as 30s")),
                "{url}: {log}"
            );
        }
    }
}

/// A value that is no duration is `InvalidConfig` naming the option and
/// the syntax, and showing neither the value nor the password.
#[test]
fn bad_durations_name_the_option_but_not_the_value() {
    for option in [
        "session_timeout",
        "tick_time",
        "connection_timeout",
        "connect_timeout",
        "container_check_interval",
    ] {
        for password in [MARKER.to_owned(), secrets::encoded()] {
            let url = format!(
                "zk://alice:{password}@{}:1/a?{option}={}",
                host(),
                secrets::encoded()
            );
            let (outcome, _) = logged(&url);
            let e = outcome.unwrap_err();
            assert!(matches!(e, LockError::InvalidConfig { .. }), "{e:?}");
            let said = e.to_string();
            assert!(
                said.contains(&format!(
                    "URL option {option}: expected a duration such as 500ms"
                )),
                "{said}"
            );
            assert_hidden("the error", &said);
            assert_hidden("the error's Debug", &format!("{e:?}"));
            assert_hidden("the log", &secrets::captured());
        }
    }
}

/// An unknown option names the known ones; one whose name is no option's
/// name (a secret pasted in the wrong place) is not shown.
#[test]
fn unknown_options_name_the_known_ones() {
    let known = "known: session_timeout, tick_time, container_check_interval, connection_timeout, connect_timeout, password_file, auth";
    let e = ZooKeeperConfig::from_url("zk://h:1/a?ttl=3s").unwrap_err();
    assert!(
        e.to_string().contains("unknown zk URL option \"ttl\"") && e.to_string().contains(known),
        "{e}"
    );
    let url = format!("zk://h:1/a?{}=1", secrets::encoded());
    let e = ZooKeeperConfig::from_url(&url).unwrap_err();
    assert!(e.to_string().contains(known), "{e}");
    assert_hidden("the error", &e.to_string());
}

/// `password_file` gives the digest password (the URL names the user);
/// a URL with both, or with no user, is refused.
#[test]
fn password_file_gives_the_digest_password() {
    let dir = std::env::temp_dir().join(format!("zk-config-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, format!("{MARKER}\n")).unwrap();
    let path = file.display();
    let config =
        ZooKeeperConfig::from_url(&format!("zk://alice@h:1/a?password_file={path}")).unwrap();
    let digest = config.credentials.as_ref().unwrap();
    assert_eq!(
        (digest.user.as_str(), digest.password.as_str()),
        ("alice", MARKER)
    );
    assert_hidden("Debug", &format!("{config:?}"));
    for url in [
        format!("zk://alice:other@h:1/a?password_file={path}"),
        format!("zk://h:1/a?password_file={path}"),
    ] {
        let e = ZooKeeperConfig::from_url(&url).unwrap_err();
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{url}: {e:?}");
        assert_hidden("the error", &e.to_string());
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Parses `url` (whose host is a fresh name: see [`host`]), and returns
/// what was logged about it: the lines of the kit's capture of every
/// thread's `tracing` output that name its host.
fn logged(url: &str) -> (Result<ZooKeeperConfig, LockError>, String) {
    secrets::capture_tracing();
    let parsed = ZooKeeperConfig::from_url(url);
    let host = url.split('@').next_back().unwrap_or(url);
    let host = host
        .split([':', '/'])
        .find(|h| h.starts_with("h-"))
        .unwrap_or(host);
    let log = secrets::captured()
        .lines()
        .filter(|line| line.contains(host))
        .collect::<Vec<_>>()
        .join("\n");
    (parsed, log)
}

/// A host name no other test uses, to find the log lines of one parse.
fn host() -> String {
    format!("h-{}", uuid::Uuid::new_v4().simple())
}

#[test]
fn parses_urls_and_connect_strings() {
    let c: ZooKeeperConfig =
        "zk://alice:s%40cret@zk1:2181,zk2:2181/apps/locks?session_timeout=10s&connection_timeout=2s&tick_time=250ms"
            .parse()
            .unwrap();
    assert_eq!(c.tick_time, Some(Duration::from_millis(250)));
    assert_eq!(c.connect, "zk1:2181,zk2:2181");
    assert_eq!(c.root, "/apps/locks");
    assert_eq!(c.session_timeout, Duration::from_secs(10));
    assert_eq!(c.connection_timeout, Some(Duration::from_secs(2)));
    let d = c.credentials.as_ref().unwrap();
    assert_eq!((d.user.as_str(), d.password.as_str()), ("alice", "s@cret"));

    let awkward =
        ZooKeeperConfig::from_url("zk://u:a#b/c?d@e:f%@h:1,[::1]:2/r?tick_time=1s").unwrap();
    let d = awkward.credentials.as_ref().unwrap();
    assert_eq!(
        (d.user.as_str(), d.password.as_str()),
        ("u", "a#b/c?d@e:f%")
    );
    assert_eq!(
        (awkward.connect.as_str(), awkward.root.as_str()),
        ("h:1,[::1]:2", "/r")
    );
    assert_eq!(awkward.tick_time, Some(Duration::from_secs(1)));
    let tls = ZooKeeperConfig::new("tcp+tls://h:1,tcp://h2/chroot");
    assert!(tls.validate().is_ok());

    let plain = ZooKeeperConfig::from_url("127.0.0.1:2181/chroot").unwrap();
    assert_eq!(plain.connect, "127.0.0.1:2181/chroot");
    assert_eq!(plain.root, ZooKeeperConfig::DEFAULT_ROOT);
    let bare = ZooKeeperConfig::from_url("zookeeper://h:1").unwrap();
    assert_eq!(bare.root, ZooKeeperConfig::DEFAULT_ROOT);
    assert_eq!(
        bare.container_check_interval,
        ZooKeeperConfig::DEFAULT_CONTAINER_CHECK_INTERVAL
    );
}

#[test]
fn rejects_bad_values_with_a_reason() {
    for (url, why) in [
        ("redis://h:1", "not a ZooKeeper URL"),
        ("zk://h:1/", ""),
        ("zk://h:1/a//b", "empty segment"),
        ("zk://h:1/a/../b", "relative"),
        ("zk://h:1/zookeeper/x", "reserved"),
        ("zk://h:1/a?session_timeout=forever", "expected a duration"),
        ("zk://h:1/a?session_timeout=0s", "session timeout"),
        ("zk://h:1/a?tick_time=0s", "tick time"),
        (
            "zk://h:1/a?container_check_interval=0s",
            "container check interval",
        ),
        ("zk://h:1/a?ttl=3s", "unknown"),
        ("zk://nocolon@h:1/a", "user:password"),
        ("zk://:pw@h:1/a", "user:password"),
        ("zk://h:99999/a", "connect string"),
        ("zk://h:1/a?%41=1", "name is not shown"),
        ("zk:///a", "connect string"),
        ("zk:/u:p@h:1/a", "two slashes"),
        ("zk://u:p@h:1/a#x", "fragment"),
        ("zk://h:1,/a", "connect string"),
        ("zk://h:x/a", "connect string"),
        ("h:1/a?b", "connect string"),
    ] {
        match ZooKeeperConfig::from_url(url) {
            Err(e @ LockError::InvalidConfig { .. }) => {
                assert!(e.to_string().contains(why), "{url}: {e}")
            }
            other if why.is_empty() => assert!(other.is_ok(), "{url}: {other:?}"),
            other => panic!("{url}: expected InvalidConfig, got {other:?}"),
        }
    }
    assert!(
        ZooKeeperConfig::new("h:1")
            .root("relative")
            .validate()
            .is_err()
    );
    assert!(ZooKeeperConfig::new("h:1").root("/").validate().is_err());
}

#[test]
fn debug_hides_the_password() {
    let c = ZooKeeperConfig::new("h:1").digest("alice", "hunter2");
    let shown = format!("{c:?}");
    assert!(
        shown.contains("alice") && !shown.contains("hunter2"),
        "{shown}"
    );
}

/// `auth=` picks how credentials authenticate: digest (the default) or
/// sasl, which a build without the `sasl` feature refuses, typed and
/// naming the feature; a bad value or `auth=` without credentials is
/// refused without showing the URL's password.
#[test]
fn auth_picks_the_scheme_of_the_credentials() {
    let url = |auth: &str| format!("zk://alice:{}@h:1/a?auth={auth}", secrets::encoded());
    let digest = ZooKeeperConfig::from_url(&url("digest")).unwrap();
    assert_eq!(digest.auth_scheme(), Some("digest"));
    assert_eq!(digest.credentials.as_ref().unwrap().password, MARKER);
    assert_hidden("Debug", &format!("{digest:?}"));
    let sasl = ZooKeeperConfig::from_url(&url("sasl"));
    #[cfg(feature = "sasl")]
    {
        let sasl = sasl.unwrap();
        assert_eq!(sasl.auth_scheme(), Some("sasl"));
        assert_eq!(sasl.credentials.as_ref().unwrap().password, MARKER);
        assert!(format!("{sasl:?}").contains("auth: Some(\"sasl\")"));
        assert_hidden("Debug", &format!("{sasl:?}"));
    }
    #[cfg(not(feature = "sasl"))]
    {
        let e = sasl.unwrap_err();
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{e:?}");
        assert!(e.to_string().contains("`sasl` feature"), "{e}");
        assert_hidden("the error", &e.to_string());
    }
    for (url, says) in [
        (url("kerberos"), "digest or sasl"),
        (url(&secrets::encoded()), "digest or sasl"),
        ("zk://h:1/a?auth=digest".to_owned(), "needs credentials"),
    ] {
        let e = ZooKeeperConfig::from_url(&url).unwrap_err();
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{e:?}");
        assert!(e.to_string().contains(says), "{e}");
        assert_hidden("the error", &e.to_string());
    }
}
