//! `distlock run --at-most` as a run-once job, end to end on the default
//! lock file (SQLite): a run that ends early keeps the name taken for
//! `--at-least` after distlock has exited, other runs are skipped with exit
//! 75 meanwhile, every run gets a larger `DISTLOCK_FENCE`, a run that
//! succeeded skips others for `--once-per` with exit 76, and a run past
//! `--at-most` is lost (exit 4). Bounds come from the durations each test
//! passes, scaled by `LOCK_TEST_TIME_SCALE`.

#![cfg(feature = "sqlite")]

mod common;

use std::time::{Duration, Instant};

use common::{Shell, eventually, exit_within};
use lock_conformance::kit::scaled;

/// `run --at-least 3s --at-most 1m job -- sh -c 'echo $DISTLOCK_FENCE > FILE'`.
fn job_args<'a>(at_least: &'a str, script: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--at-least",
        at_least,
        "--at-most",
        "1m",
        "nightly",
        "--",
        "sh",
        "-c",
        script,
    ]
}

fn fence_in(path: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    text.trim().parse().unwrap_or_else(|_| panic!("{text:?}"))
}

#[test]
fn at_least_outlives_distlock_and_skips_others_with_75() {
    let shell = Shell::new();
    let at_least = scaled(Duration::from_secs(3));
    let at_least_arg = format!("{}ms", at_least.as_millis());
    let (first, second) = (shell.path("first"), shell.path("second"));
    let write_first = format!("echo $DISTLOCK_FENCE > {}", first.display());
    let asked = Instant::now();
    let ran = shell.output(&job_args(&at_least_arg, &write_first));
    let returned = Instant::now();
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let fence = fence_in(&first);
    assert!(
        returned < asked + at_least,
        "the first run took its whole at_least ({:?}): nothing left to check",
        returned - asked
    );
    // distlock has exited: the store alone keeps the name taken.
    let write_second = format!("echo $DISTLOCK_FENCE > {}", second.display());
    let skipped = shell.output(&job_args("0s", &write_second));
    let checked = Instant::now();
    let stderr = String::from_utf8_lossy(&skipped.stderr);
    if checked < asked + at_least {
        assert_eq!(skipped.status.code(), Some(75), "{skipped:?}");
        assert!(stderr.contains("skipped"), "{stderr}");
        assert!(!second.exists(), "a skipped run ran its command");
    }
    let bound = scaled(Duration::from_secs(5));
    let ran_at = eventually(at_least + bound, "a run after --at-least", || {
        let next = shell.output(&job_args("0s", &write_second));
        match next.status.code() {
            Some(0) => Some(Instant::now()),
            Some(75) => None,
            other => panic!("unexpected exit {other:?}: {next:?}"),
        }
    });
    assert!(
        ran_at >= asked + at_least,
        "a second run came {:?} after the first was asked for, before --at-least {at_least:?}",
        ran_at - asked
    );
    assert!(fence_in(&second) > fence, "the fence must grow per run");
}

/// `run --at-most 1m --once-per WINDOW hourly -- sh -c SCRIPT`.
fn once_args<'a>(window: &'a str, script: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--at-most",
        "1m",
        "--once-per",
        window,
        "hourly",
        "--",
        "sh",
        "-c",
        script,
    ]
}

#[test]
fn once_per_skips_with_76_after_a_success_not_after_a_failure() {
    let shell = Shell::new();
    let window = scaled(Duration::from_secs(3));
    let window_arg = format!("{}ms", window.as_millis());
    let failed = shell.output(&once_args(&window_arg, "exit 3"));
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    let first = shell.path("first");
    let asked = Instant::now();
    let write_first = format!("echo $DISTLOCK_FENCE > {}", first.display());
    let ran = shell.output(&once_args(&window_arg, &write_first));
    assert_eq!(
        ran.status.code(),
        Some(0),
        "a failed run was counted: {ran:?}"
    );
    let fence = fence_in(&first);
    let skipped = shell.output(&once_args(&window_arg, "exit 9"));
    let inspected = shell.output(&["inspect", "hourly"]);
    let json = shell.output(&["inspect", "--json", "hourly"]);
    if Instant::now() < asked + window {
        let stderr = String::from_utf8_lossy(&skipped.stderr);
        assert_eq!(skipped.status.code(), Some(76), "{skipped:?}");
        assert!(
            stderr.contains(&format!("already ran in this window (fence={fence}")),
            "{stderr}"
        );
        let text = String::from_utf8_lossy(&inspected.stdout);
        assert!(
            text.contains(&format!("hourly: last run fence={fence}, took ")),
            "{text}"
        );
        let json = String::from_utf8_lossy(&json.stdout);
        assert!(
            json.contains(&format!("\"last_run\":{{\"fence\":{fence},")),
            "{json}"
        );
    }
    let bound = scaled(Duration::from_secs(5));
    let ran_at = eventually(window + bound, "a run after --once-per", || {
        let next = shell.output(&once_args(&window_arg, "true"));
        match next.status.code() {
            Some(0) => Some(Instant::now()),
            Some(76) => None,
            other => panic!("unexpected exit {other:?}: {next:?}"),
        }
    });
    assert!(
        ran_at >= asked + window,
        "a second run came {:?} after the first was asked for, within --once-per {window:?}",
        ran_at - asked
    );
}

#[test]
fn a_run_past_at_most_is_lost_and_exits_4() {
    let shell = Shell::new();
    let at_most = scaled(Duration::from_secs(1));
    let at_most_arg = format!("{}ms", at_most.as_millis());
    let started = Instant::now();
    let mut distlock = shell.spawn(&[
        "run",
        "--grace",
        "1s",
        "--at-most",
        &at_most_arg,
        "capped",
        "--",
        "sleep",
        "100",
    ]);
    let status = exit_within(
        &mut distlock,
        at_most + scaled(Duration::from_secs(6)),
        "--at-most",
    );
    assert_eq!(status.code(), Some(4), "{status:?}");
    assert!(started.elapsed() >= at_most, "lost before --at-most");
    // The lost run left nothing behind: the next one runs at once.
    let next = shell.output(&["run", "--at-most", "1m", "capped", "--", "true"]);
    assert_eq!(next.status.code(), Some(0), "{next:?}");
}

#[test]
fn the_commands_exit_code_passes_through_and_bad_windows_are_usage_errors() {
    let shell = Shell::new();
    let ran = shell.output(&[
        "run",
        "--at-most",
        "1m",
        "coded",
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(ran.status.code(), Some(7), "{ran:?}");
    for bad in [
        &["run", "--at-least", "2s", "w", "--", "true"][..],
        &[
            "run",
            "--at-least",
            "10s",
            "--at-most",
            "5s",
            "w",
            "--",
            "true",
        ][..],
        &["run", "--at-most", "0s", "w", "--", "true"][..],
        &[
            "run",
            "--at-most",
            "1m",
            "--permits",
            "2",
            "w",
            "--",
            "true",
        ][..],
    ] {
        let out = shell.output(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
}
