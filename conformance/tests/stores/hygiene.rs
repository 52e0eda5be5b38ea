//! External stores are never hurt, launched ones die with the test binary,
//! a missing one fails loudly unless the run is explicitly partial.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lock_conformance::kit::poll;

use super::*;

#[test]
fn external_stores_are_used_as_given_and_never_hurt() {
    // Only meaningful in runs that set the variables (the CI workflow does).
    for (kind, store) in [
        (Kind::Redis, redis::try_shared()),
        (Kind::Postgres, postgres::try_shared()),
        (Kind::Etcd, etcd::try_shared()),
        (Kind::ZooKeeper, zookeeper::try_shared()),
    ] {
        let store = store.unwrap_or_else(|e| panic!("{kind}: {e}"));
        let external = kind.external_url().is_some();
        assert_eq!(store.is_external(), external, "{kind}");
        assert!(store.serves(), "{kind} at {} does not serve", store.addr());
        if external {
            let err = store.kill_now().unwrap_err();
            assert!(err.to_string().contains(kind.env_var()), "{err}");
        }
    }
}

/// Run by `shared_stores_die_with_the_test_binary` in a child process.
#[test]
#[ignore = "helper: run by shared_stores_die_with_the_test_binary"]
fn helper_start_shared_store_and_exit() {
    if std::env::var("DISTLOCK_HYGIENE_HELPER").as_deref() != Ok("1") {
        return;
    }
    let store = redis::shared();
    println!(
        "HYGIENE {} {}",
        store.pid().unwrap(),
        store.data_dir().unwrap().display()
    );
}

#[test]
fn shared_stores_die_with_the_test_binary() {
    if !launcher_run(&[Kind::Redis]) {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "hygiene::helper_start_shared_store_and_exit",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("DISTLOCK_HYGIENE_HELPER", "1")
        .env_remove("LOCK_TEST_REDIS_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.find("HYGIENE ").map(|at| &l[at + 8..]))
        .unwrap_or_else(|| {
            panic!(
                "helper printed no HYGIENE line: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let mut words = line.split_whitespace();
    let pid: u32 = words.next().unwrap().parse().unwrap();
    let dir = PathBuf::from(words.next().unwrap());
    let what = format!("the exit of redis {pid} with its test binary");
    poll::blocking_until(Duration::from_secs(5), &what, || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .contains("State:\tZ")
    });
    assert!(!dir.exists(), "{} outlived its test binary", dir.display());
}

/// Run by `a_missing_store_fails_loudly_unless_partial` in a child process
/// whose PATH has no redis-server.
#[test]
#[ignore = "helper: run by a_missing_store_fails_loudly_unless_partial"]
fn helper_shared_or_skip_without_redis() {
    if std::env::var("DISTLOCK_MISSING_HELPER").as_deref() != Ok("1") {
        return;
    }
    match redis::shared_or_skip() {
        Some(_) => println!("RESULT launched"),
        None => println!("RESULT skipped"),
    }
}

#[test]
fn a_missing_store_fails_loudly_unless_partial() {
    let exe = std::env::current_exe().unwrap();
    let run = |partial: bool, ci: bool| {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--ignored",
            "--exact",
            "hygiene::helper_shared_or_skip_without_redis",
            "--nocapture",
        ])
        .env("DISTLOCK_MISSING_HELPER", "1")
        .env("PATH", "/nonexistent")
        .env_remove("LOCK_TEST_REDIS_URL")
        .env_remove("LOCK_TEST_PARTIAL")
        .env_remove("CI");
        if partial {
            cmd.env("LOCK_TEST_PARTIAL", "1");
        }
        if ci {
            cmd.env("CI", "true");
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run(false, false);
    assert!(!ok, "a missing redis-server must fail the test: {text}");
    assert!(
        text.contains("apt-get install -y redis-server") && text.contains("scripts/test-all.sh"),
        "the failure names the package and the script: {text}"
    );
    let (ok, text) = run(true, false);
    assert!(
        ok && text.contains("RESULT skipped") && text.contains("SKIP:"),
        "LOCK_TEST_PARTIAL=1 skips loudly: {text}"
    );
    let (ok, text) = run(true, true);
    assert!(
        !ok && !text.contains("RESULT skipped"),
        "CI=true never skips: {text}"
    );
}
