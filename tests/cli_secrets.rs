//! `distlock` never shows a password: for every scheme, a one-slash typo, a
//! libpq `key=value` string and an unknown scheme, with the kit's marker
//! password typed raw and percent-encoded, given as `--url` and as
//! `DISTLOCK_URL`, with `DISTLOCK_LOG=trace`, no command (`run`, `hold`,
//! `inspect`, `force-release`, `schemes`) prints any part of it on stdout or
//! stderr: not when nothing listens, not when a real store with passwords
//! refuses it, not when it is right and the command succeeds.

#![cfg(target_os = "linux")]
// Without a server store's feature, only the first test is built.
#![cfg_attr(
    not(any(
        feature = "redis",
        feature = "postgres",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::Shell;
use lock_conformance::kit::secrets::{self, MARKER};

/// The marker as typed into a URL, and percent-encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Raw,
    Encoded,
}

impl Form {
    const BOTH: [Form; 2] = [Form::Raw, Form::Encoded];

    fn password(self) -> String {
        match self {
            Form::Raw => MARKER.to_owned(),
            Form::Encoded => secrets::encoded(),
        }
    }

    /// `template` with `PW` replaced by the marker in this form, and the
    /// template as the URL's name in failures (which must not show it either).
    fn url(self, template: &str) -> (String, String) {
        (
            template.replace("PW", &self.password()),
            format!("{template} ({self:?})"),
        )
    }
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What a URL must do, besides never showing its password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Every command that needs the store exits non-zero.
    Fails,
    /// Every command succeeds.
    Connects,
    /// Either, as the adapter reads the URL (a raw marker's `#/?@` can make
    /// a URL unreadable).
    Either,
}

/// What went wrong across a matrix of URLs, reported together at the end so
/// one run shows every leak.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    /// Runs every command with `template`'s URL in `form`, given as `--url`
    /// and as `DISTLOCK_URL`, at trace level, and notes each line of output
    /// that shows a part of the marker and each exit code `expect` rules out.
    fn drive(&mut self, shell: &Shell, template: &str, form: Form, expect: Expect) {
        let (url, what) = form.url(template);
        // A name of its own per URL, that shows nothing of it.
        static URLS: AtomicUsize = AtomicUsize::new(0);
        let name = format!("secret-{}", URLS.fetch_add(1, Ordering::Relaxed));
        let commands: [Vec<&str>; 5] = [
            vec!["run", &name, "--", "true"],
            vec!["hold", &name],
            vec!["inspect", &name],
            vec!["force-release", &name, "--reason", "test"],
            vec!["schemes"],
        ];
        let mut leaks: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for command in &commands {
            for given in ["--url", "DISTLOCK_URL"] {
                let mut cmd = if given == "--url" {
                    let mut args = vec!["--url", url.as_str()];
                    args.extend(command);
                    shell.distlock(&args)
                } else {
                    let mut cmd = shell.distlock(command);
                    cmd.env("DISTLOCK_URL", &url);
                    cmd
                };
                let out = cmd.env("DISTLOCK_LOG", "trace").output().unwrap();
                let text = format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                let case = format!("{} ({given})", command[0]);
                for line in text.lines().filter(|line| secrets::leaks(line).is_some()) {
                    leaks.entry(line.to_owned()).or_default().push(case.clone());
                }
                let code = out.status.code();
                let succeeded = code == Some(0);
                let wrong = match expect {
                    _ if command[0] == "schemes" => !succeeded,
                    Expect::Fails => succeeded,
                    Expect::Connects => !succeeded,
                    Expect::Either => false,
                };
                if wrong {
                    let last = text.trim_end().lines().last().unwrap_or_default();
                    let last = if secrets::leaks(last).is_some() {
                        "(a line showing the marker)"
                    } else {
                        last
                    };
                    self.0.push(format!(
                        "{what}: {case}: exit {code:?}, expected {expect:?}: {last}"
                    ));
                }
            }
        }
        for (line, cases) in leaks {
            self.0.push(format!(
                "{what} shows: {line}\n    in: {}",
                cases.join(", ")
            ));
        }
    }

    /// Fails with every problem noted.
    fn check(self) {
        assert!(
            self.0.is_empty(),
            "{} problems:\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// Nothing listens, or the URL cannot be read: every scheme, both forms.
#[test]
fn unreachable_and_malformed_urls() {
    let shell = Shell::new();
    let mut problems = Problems::default();
    let port = closed_port();
    let dir = shell.dir.path().display().to_string();
    for template in [
        format!("redis://u:PW@127.0.0.1:{port}/0"),
        format!("rediss://u:PW@127.0.0.1:{port}"),
        format!("redis+unix://u:PW@{dir}/no.sock"),
        format!("postgres://u:PW@127.0.0.1:{port}/db"),
        format!("postgresql://u@127.0.0.1:{port}/db?password=PW"),
        format!("etcd://u:PW@127.0.0.1:{port}"),
        format!("etcds://u:PW@127.0.0.1:{port}"),
        format!("zk://u:PW@127.0.0.1:{port}"),
        format!("zookeeper://u:PW@127.0.0.1:{port}/root"),
        format!("sqlite://{dir}/locks.db?password=PW"),
        format!("sqlite://{dir}/locks.db?timeout_ms=PW"),
        format!("redis:/u:PW@127.0.0.1:{port}"),
        format!("postgres:/u:PW@127.0.0.1:{port}/db"),
        format!("host=127.0.0.1 port={port} user=u password=PW dbname=d"),
        format!("ftp://u:PW@127.0.0.1:{port}/"),
        format!("u:PW@127.0.0.1:{port}"),
    ] {
        for form in Form::BOTH {
            problems.drive(&shell, &template, form, Expect::Fails);
        }
    }
    problems.check();
}

/// Sends one command to Redis at `addr` and returns its reply's first line.
#[cfg(feature = "redis")]
fn redis_command(addr: std::net::SocketAddr, args: &[&str]) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = [0u8; 256];
    let n = stream.read(&mut reply).unwrap();
    String::from_utf8_lossy(&reply[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The right password: success when encoded; raw, as the adapter reads it.
fn right(form: Form) -> Expect {
    match form {
        Form::Raw => Expect::Either,
        Form::Encoded => Expect::Connects,
    }
}

/// A private Redis whose password is the marker: wrong, then right.
#[test]
#[cfg(feature = "redis")]
fn redis_with_a_password() {
    use lock_conformance::kit::stores;
    let shell = Shell::new();
    let mut problems = Problems::default();
    let store = stores::redis::start(stores::redis::Options::default()).unwrap();
    let addr = store.addr();
    assert_eq!(
        redis_command(addr, &["CONFIG", "SET", "requirepass", MARKER]),
        "+OK"
    );
    for form in Form::BOTH {
        let wrong = Expect::Fails;
        problems.drive(&shell, &format!("redis://:xPW@{addr}/0"), form, wrong);
        problems.drive(&shell, &format!("redis://nobody:PW@{addr}"), form, wrong);
        problems.drive(&shell, &format!("redis://:PW@{addr}"), form, right(form));
        problems.drive(
            &shell,
            &format!("redis://default:PW@{addr}/0"),
            form,
            right(form),
        );
    }
    problems.check();
}

/// A private PostgreSQL that checks passwords, with a role whose password is
/// the marker: wrong, then right.
#[test]
#[cfg(feature = "postgres")]
fn postgres_with_a_password() {
    use lock_conformance::kit::stores;
    let shell = Shell::new();
    let mut problems = Problems::default();
    let store =
        stores::postgres::start(stores::postgres::Options::default().password_auth(true)).unwrap();
    for statement in [
        format!("CREATE ROLE locker LOGIN PASSWORD '{MARKER}'"),
        "CREATE ROLE other LOGIN PASSWORD 'not-the-marker'".to_owned(),
        "CREATE DATABASE locks OWNER locker".to_owned(),
    ] {
        let out = std::process::Command::new("psql")
            .args([
                &store.url(),
                "-v",
                "ON_ERROR_STOP=1",
                "-q",
                "-c",
                &statement,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "psql: {out:?}");
    }
    let addr = store.addr();
    for form in Form::BOTH {
        let wrong = Expect::Fails;
        problems.drive(
            &shell,
            &format!("postgres://other:PW@{addr}/locks"),
            form,
            wrong,
        );
        problems.drive(
            &shell,
            &format!("postgres://other@{addr}/locks?password=PW"),
            form,
            wrong,
        );
        problems.drive(
            &shell,
            &format!("postgres://locker:PW@{addr}/locks"),
            form,
            right(form),
        );
        problems.drive(
            &shell,
            &format!("postgresql://locker:PW@{addr}/locks?sslmode=disable"),
            form,
            right(form),
        );
    }
    problems.check();
}

/// The kit's etcd, which has no users: the marker as a password is refused
/// (or, by an adapter that skips authentication, ignored), never shown.
#[test]
#[cfg(feature = "etcd")]
fn etcd_with_a_password() {
    use lock_conformance::kit::stores;
    let shell = Shell::new();
    let mut problems = Problems::default();
    let addr = stores::etcd::shared().addr();
    for form in Form::BOTH {
        problems.drive(&shell, &format!("etcd://u:PW@{addr}"), form, Expect::Either);
        // TLS to a plaintext server.
        problems.drive(&shell, &format!("etcds://u:PW@{addr}"), form, Expect::Fails);
    }
    problems.check();
}

/// The kit's ZooKeeper: digest credentials holding the marker are accepted
/// (ZooKeeper checks them against ACLs only), and the commands succeed.
#[test]
#[cfg(feature = "zookeeper")]
fn zookeeper_with_a_password() {
    use lock_conformance::kit::stores;
    let shell = Shell::new();
    let mut problems = Problems::default();
    let addr = stores::zookeeper::shared().addr();
    for form in Form::BOTH {
        problems.drive(&shell, &format!("zk://locker:PW@{addr}"), form, right(form));
        problems.drive(
            &shell,
            &format!("zookeeper://locker:PW@{addr}/locks"),
            form,
            right(form),
        );
    }
    problems.check();
}
