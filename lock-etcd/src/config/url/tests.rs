//! The URL's options: each new spelling read, each old one still read with
//! a warning naming the new one, bad values typed errors that show neither
//! the value nor the password, unknown options refused naming the known ones.

use lock_conformance::kit::logs::captured as logged;
use lock_conformance::kit::secrets::{self, MARKER};

use super::*;

/// A PEM file's stand-in (the URL only reads it; connecting checks it).
fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Stand-ins for a CA's, a client certificate's and its key's PEM files.
fn pem_files(dir: &tempfile::TempDir) -> (String, String, String) {
    (
        file(dir, "ca.pem", "CA"),
        file(dir, "cert.pem", "CERT"),
        file(dir, "key.pem", "KEY"),
    )
}

#[test]
fn every_option_is_read_by_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pem_files(&dir);
    let password = file(&dir, "password", "pw from a file\nignored");
    let url = format!(
        "etcd://locker@h:1?timeout=250ms&connect_timeout=2s&prefix=billing/&tls_ca={ca}\
         &tls_cert={cert}&tls_key={key}&tls_domain=etcd.local&password_file={password}"
    );
    let (config, warnings) = logged(|| EtcdConfig::from_url(&url));
    let config = config.unwrap();
    assert_eq!(warnings, "", "the current names warn about nothing");
    assert_eq!(config.request_timeout, Duration::from_millis(250));
    assert_eq!(config.connect_timeout, Duration::from_secs(2));
    assert_eq!(config.key_prefix(), "billing/");
    assert_eq!(
        config.user,
        Some(("locker".into(), "pw from a file".into()))
    );
    let tls = config.tls.as_ref().expect("TLS options turn TLS on");
    assert_eq!(tls.ca_pem.as_deref(), Some(&b"CA"[..]));
    assert_eq!(tls.identity_pem, Some((b"CERT".to_vec(), b"KEY".to_vec())));
    assert_eq!(tls.domain.as_deref(), Some("etcd.local"));
    assert_eq!(config.endpoints(), ["https://h:1"]);
}

#[test]
fn old_spellings_are_still_read_and_warn_with_the_new_name() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pem_files(&dir);
    type Check = Box<dyn Fn(&EtcdConfig)>;
    let cases: [(String, &str, Check); 5] = [
        (
            "etcd://h:1?timeout=1.5".into(),
            "timeout=2s",
            Box::new(|c| assert_eq!(c.request_timeout, Duration::from_millis(1500))),
        ),
        (
            format!("etcd://h:1?ca={ca}"),
            "tls_ca",
            Box::new(|c| assert_eq!(c.tls.as_ref().unwrap().ca_pem.as_deref(), Some(&b"CA"[..]))),
        ),
        (
            format!("etcd://h:1?cert={cert}&key={key}"),
            "tls_cert",
            Box::new(|c| assert!(c.tls.as_ref().unwrap().identity_pem.is_some())),
        ),
        (
            "etcd://h:1?domain=etcd.local".into(),
            "tls_domain",
            Box::new(|c| {
                assert_eq!(
                    c.tls.as_ref().unwrap().domain.as_deref(),
                    Some("etcd.local")
                )
            }),
        ),
        (
            format!("etcd://root:{MARKER}@h:1"),
            "percent-encode",
            Box::new(|c| assert_eq!(c.user, Some(("root".into(), MARKER.into())))),
        ),
    ];
    for (url, new_name, check) in cases {
        let (config, warnings) = logged(|| EtcdConfig::from_url(&url));
        let shown = redact_url(&url);
        let config = config.unwrap_or_else(|e| panic!("{shown}: {e}"));
        check(&config);
        assert!(
            warnings.contains("WARN") && warnings.contains(new_name),
            "{shown}: the warning names {new_name}: {warnings:?}"
        );
        let old_names = url.matches('=').count().max(1);
        assert_eq!(
            warnings.lines().count(),
            old_names,
            "one line per old name: {warnings:?}"
        );
        secrets::assert_hidden(&format!("{shown}: the warning"), &warnings);
    }
    // Both spellings: the new one wins.
    let (config, _) = logged(|| EtcdConfig::from_url("etcd://h:1?domain=old&tls_domain=new"));
    assert_eq!(config.unwrap().tls.unwrap().domain.as_deref(), Some("new"));
}

#[test]
fn a_bad_value_is_a_typed_error_showing_neither_it_nor_the_password() {
    for password in [MARKER.to_owned(), secrets::encoded()] {
        for option in [
            format!("timeout={}", secrets::encoded()),
            "timeout=5".to_owned() + "x",
            "timeout=-1s".to_owned(),
            format!("connect_timeout={}", secrets::encoded()),
            format!("tls_ca=/nonexistent/{}", secrets::encoded()),
        ] {
            let url = format!("etcd://root:{password}@h:1/app/?{option}");
            let (parsed, warnings) = logged(|| EtcdConfig::from_url(&url));
            let shown = redact_url(&url);
            let err = parsed.expect_err(&shown);
            assert!(
                matches!(err, LockError::InvalidConfig { .. }),
                "{shown}: {err:?}"
            );
            let name = option.split('=').next().unwrap();
            assert!(
                err.to_string().contains(name),
                "{shown}: names {name}: {err}"
            );
            let value = option.split_once('=').unwrap().1;
            assert!(
                !err.to_string().contains(value),
                "{shown}: shows its value: {err}"
            );
            secrets::assert_hidden(&shown, &format!("{err} {err:?}"));
            secrets::assert_hidden(&format!("{shown}: the log"), &warnings);
        }
    }
}

#[test]
fn an_unknown_option_names_the_known_ones() {
    let url = format!(
        "etcd://root:{MARKER}@h:1?tls_ca_file=/ca.pem&secret={}",
        secrets::encoded()
    );
    let err = EtcdConfig::from_url(&url).unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("tls_ca_file"),
        "names the unknown one: {text}"
    );
    for known in KNOWN {
        assert!(text.contains(known), "names {known}: {text}");
    }
    secrets::assert_hidden("the error", &format!("{err} {err:?}"));
}

#[test]
fn parses_urls() {
    let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
    assert_eq!(c.endpoints(), ["http://127.0.0.1:2379"]);
    assert_eq!(c.key_prefix(), "distlock/");
    assert!(c.user.is_none() && c.tls.is_none());

    let c = EtcdConfig::from_url("etcd://u%40x:p%3Aw@a:1,b:2/my%2Fapp/?timeout=1500ms").unwrap();
    assert_eq!(c.endpoints(), ["http://a:1", "http://b:2"]);
    assert_eq!(c.key_prefix(), "my/app/");
    assert_eq!(c.user, Some(("u@x".into(), "p:w".into())));
    assert_eq!(c.request_timeout, Duration::from_millis(1500));

    let c = EtcdConfig::from_url("etcd://[::1]:2379?prefix=app/&connect_timeout=250ms").unwrap();
    assert_eq!(c.endpoints(), ["http://[::1]:2379"]);
    assert_eq!(c.key_prefix(), "app/");
    assert_eq!(c.connect_timeout, Duration::from_millis(250));

    // The option that bounded TTLs is gone: etcd's own maximum applies.
    assert!(EtcdConfig::from_url("etcd://h:1?max_ttl=3600").is_err());

    // A password with the characters URLs treat specially, raw (read
    // for one more release): the user info runs to the last `@`.
    let c = EtcdConfig::from_url("etcd://u:p#/?@:%x@a:1/app/?timeout=2s").unwrap();
    assert_eq!(c.endpoints(), ["http://a:1"]);
    assert_eq!(c.user, Some(("u".into(), "p#/?@:%x".into())));
    assert_eq!(c.key_prefix(), "app/");
    assert_eq!(c.request_timeout, Duration::from_secs(2));
    // An `@` in the prefix is written `%40` (unescaped, everything up to
    // it reads as user info, as `redact_url` hides it).
    let c = EtcdConfig::from_url("etcd://a:1/x%40y/").unwrap();
    assert!(c.user.is_none());
    assert_eq!(c.key_prefix(), "x@y/");
    assert!(EtcdConfig::from_url("etcd://a:1/x@y/").is_err());

    let c = EtcdConfig::from_url("etcds://h:2379?tls_domain=etcd.local").unwrap();
    assert_eq!(c.endpoints(), ["https://h:2379"]);
    assert_eq!(c.tls.unwrap().domain.as_deref(), Some("etcd.local"));
    // A TLS option turns TLS on for `etcd://` too.
    let c = EtcdConfig::from_url("etcd://h:2379?tls_domain=etcd.local").unwrap();
    assert_eq!(c.endpoints(), ["https://h:2379"]);
}

#[test]
fn rejects_bad_urls_without_echoing_secrets() {
    for bad in [
        "redis://h:1",
        "etcd://",
        "etcd://h",
        "etcd://h:0",
        "etcd://h:99999",
        "etcd://h:1?nope=1",
        "etcd://h:1?timeout=-1",
        "etcd://h:1?timeout=0",
        "etcd://h:1?tls_cert=/nonexistent",
        "etcd://h:1?tls_cert=/nonexistent&tls_key=/nonexistent",
        "etcd://h:1?tls_ca=",
        "etcd://u:topsecret@h:1?timeout=x",
        "etcd://:topsecret@h:1",
        "etcd://h:1/app/?prefix=other/",
        "etcd://h:1/%FF",
        "no-scheme",
    ] {
        let err = EtcdConfig::from_url(bad).unwrap_err();
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{bad}: {err:?}"
        );
        assert!(!err.to_string().contains("topsecret"), "{err}");
    }
}
