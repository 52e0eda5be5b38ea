//! Parsing, checking and showing configurations.

use super::*;

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
    let d = c.digest.as_ref().unwrap();
    assert_eq!((d.user.as_str(), d.password.as_str()), ("alice", "s@cret"));

    let awkward =
        ZooKeeperConfig::from_url("zk://u:a#b/c?d@e:f%@h:1,[::1]:2/r?tick_time=1s").unwrap();
    let d = awkward.digest.as_ref().unwrap();
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
}

#[test]
fn rejects_bad_values_with_a_reason() {
    for (url, why) in [
        ("redis://h:1", "not a ZooKeeper URL"),
        ("zk://h:1/", ""),
        ("zk://h:1/a//b", "empty segment"),
        ("zk://h:1/a/../b", "relative"),
        ("zk://h:1/zookeeper/x", "reserved"),
        ("zk://h:1/a?session_timeout=forever", "not a duration"),
        ("zk://h:1/a?session_timeout=0s", "session timeout"),
        ("zk://h:1/a?tick_time=0s", "tick time"),
        ("zk://h:1/a?ttl=3s", "unknown"),
        ("zk://nocolon@h:1/a", "user:password"),
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
