//! Tests of the URL options: each name read, each old spelling read with a
//! warning naming the new one, bad values and unknown options refused as
//! `InvalidConfig` without echoing anything, and `password_file`.

use std::time::Duration;

use lockcore::LockError;

use super::{OWN_OPTIONS, PostgresConfig};

/// What `from_url` logs, and its result.
fn logged(url: &str) -> (String, Result<PostgresConfig, LockError>) {
    let (result, text) = lock_conformance::kit::logs::captured(|| PostgresConfig::from_url(url));
    (text, result)
}

/// `(schema, table, pool_size, timeout, connect_timeout, create_schema, turnstiles)`.
fn settings(config: &PostgresConfig) -> (&str, &str, u32, Duration, Duration, bool, u32) {
    (
        &config.schema,
        &config.table,
        config.pool_size,
        config.op_timeout,
        config.connect_timeout,
        config.create_schema,
        config.turnstiles,
    )
}

#[test]
fn options_are_read_by_their_names_and_stripped() {
    let (log, config) = logged(
        "postgresql://u@h:1/d?schema=locks&table=t1&pool_size=3&timeout=250ms&connect_timeout=2s&create_schema=false&turnstiles=0&application_name=app",
    );
    let config = config.unwrap();
    assert_eq!(
        settings(&config),
        (
            "locks",
            "t1",
            3,
            Duration::from_millis(250),
            Duration::from_secs(2),
            false,
            0
        )
    );
    assert!(!log.contains("renamed"), "{log}");
    let options = config.connect_options();
    assert_eq!(options.get_application_name(), Some("app"));
    // libpq's connect_timeout: whole seconds.
    let config = PostgresConfig::from_url("postgres://u@h/d?connect_timeout=7").unwrap();
    assert_eq!(config.connect_timeout, Duration::from_secs(7));
}

#[test]
fn old_spellings_are_read_with_a_warning_naming_the_new_one() {
    for (old, new, check) in [
        (
            "lock_schema=s1",
            "schema",
            (|c: &PostgresConfig| c.schema == "s1") as fn(&PostgresConfig) -> bool,
        ),
        ("lock_table=t1", "table", |c| c.table == "t1"),
        ("lock_pool_size=4", "pool_size", |c| c.pool_size == 4),
        ("lock_op_timeout_ms=1500", "timeout", |c| {
            c.op_timeout == Duration::from_millis(1500)
        }),
        ("lock_connect_timeout_ms=300", "connect_timeout", |c| {
            c.connect_timeout == Duration::from_millis(300)
        }),
        ("lock_create_schema=false", "create_schema", |c| {
            !c.create_schema
        }),
        ("lock_turnstiles=2", "turnstiles", |c| c.turnstiles == 2),
    ] {
        let (log, config) = logged(&format!("postgres://u@h/d?{old}"));
        let config = config.unwrap_or_else(|e| panic!("{old}: {e}"));
        assert!(check(&config), "{old}: {config:?}");
        let old_name = old.split('=').next().unwrap();
        assert!(
            log.contains(&format!("URL option {old_name} is renamed {new}")),
            "{old}: {log}"
        );
        assert_eq!(log.lines().count(), 1, "one line: {log}");
    }
    // Both given: the new one wins.
    let config = PostgresConfig::from_url("postgres://u@h/d?lock_table=old&table=new").unwrap();
    assert_eq!(config.table, "new");
}

#[test]
fn bad_values_are_typed_errors_that_echo_nothing() {
    use lock_conformance::kit::secrets::{assert_hidden, encoded};
    for option in [
        "timeout",
        "connect_timeout",
        "lock_op_timeout_ms",
        "pool_size",
        "turnstiles",
        "create_schema",
    ] {
        let url = format!("postgres://u:{}@h/d?{option}={}", encoded(), encoded());
        let err = PostgresConfig::from_url(&url).unwrap_err();
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{option}: {err}"
        );
        assert!(err.to_string().contains(option), "{option}: {err}");
        assert_hidden(option, &format!("{err} {err:?}"));
    }
    for bad in [
        "timeout=30",
        "timeout=0",
        "connect_timeout=0s",
        "pool_size=0",
        "turnstiles=65",
    ] {
        let err = PostgresConfig::from_url(&format!("postgres://u@h/d?{bad}")).unwrap_err();
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{bad}: {err}"
        );
    }
}

#[test]
fn an_unknown_option_names_the_known_ones_but_never_a_password_part() {
    let err = PostgresConfig::from_url("postgres://u@h/d?tabel=x").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{text}");
    assert!(
        text.contains("unknown postgres URL option \"tabel\""),
        "{text}"
    );
    for known in OWN_OPTIONS {
        assert!(text.contains(known), "{known}: {text}");
    }
    // After a password, an unknown name may be the password's tail.
    let err = PostgresConfig::from_url("postgres://u@h/d?password=ab&s3cret=cd").unwrap_err();
    assert!(!err.to_string().contains("s3cret"), "{err}");
    // libpq's own parameters that sqlx ignores are dropped, not refused.
    let (log, config) = logged("postgres://u@h/d?target_session_attrs=any&keepalives=1");
    config.unwrap();
    assert!(log.contains("target_session_attrs"), "{log}");
}

#[test]
fn the_password_may_come_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "from-file\n").unwrap();
    let config = PostgresConfig::from_url(&format!(
        "postgres://u@h/d?password_file={}",
        file.display()
    ))
    .unwrap();
    let options = config.connect_options();
    // sqlx's own Debug shows the password (ours never does).
    assert!(format!("{options:?}").contains("from-file"));
    assert!(!format!("{config:?}").contains("from-file"));
    for both in [
        format!("postgres://u:pw@h/d?password_file={}", file.display()),
        format!(
            "postgres://u@h/d?password=pw&password_file={}",
            file.display()
        ),
    ] {
        let err = PostgresConfig::from_url(&both).unwrap_err();
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{both}: {err}"
        );
    }
}
