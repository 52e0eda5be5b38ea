//! Signals around `distlock run`'s supervisor: a quick Ctrl-Z and `fg` go
//! on with the job on every store; SIGTERM sent to every process at once (as
//! `systemctl stop` does) leaves the job its own shutdown instead of killing
//! the supervisor; the job starts with no signal blocked or ignored; and
//! what a job leaves behind when it exits dies at the lease's deadline while
//! distlock is stopped, not after a longer grace.
//!
//! Bounds come from the TTL each test passes, scaled by
//! `LOCK_TEST_TIME_SCALE`; every wait polls.

#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::{
    Cleanup, Shell, alive, children, eventually, exit_within, held_still, read_pid, show, signal,
    stat, stderr_of,
};
use lock_conformance::kit::scaled;

/// How soon the supervisor acts once told (or once its deadline passed):
/// far below every TTL here.
fn act_bound() -> Duration {
    scaled(Duration::from_millis(1500))
}

/// `--url` of the kit's shared store (`None`: the default SQLite file), with
/// a session of `ttl` on ZooKeeper (its leases are its sessions).
fn url(store: &str, ttl: Duration) -> Option<String> {
    use lock_conformance::kit::stores;
    match store {
        "redis" => Some(stores::redis::shared().url()),
        "postgres" => Some(stores::postgres::shared().url()),
        "etcd" => Some(stores::etcd::shared().url()),
        "zookeeper" => {
            let url = stores::zookeeper::shared().url();
            let joint = if url.contains('?') { '&' } else { '?' };
            Some(format!("{url}{joint}session_timeout={}ms", ttl.as_millis()))
        }
        _ => None,
    }
}

/// `distlock --ttl TTL [--url URL] ARGS...` started from `shell`.
fn spawn(shell: &Shell, store: &str, ttl: Duration, args: &[&str]) -> std::process::Child {
    let ttl_arg = format!("{}ms", ttl.as_millis());
    let mut all = vec!["--ttl".to_owned(), ttl_arg];
    if let Some(url) = url(store, ttl) {
        all.extend(["--url".to_owned(), url]);
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    shell.spawn(&all)
}

/// Ctrl-Z then SIGCONT long before the lease's deadline: the job stops with
/// distlock, goes on with it, and the run ends with the job's own code.
fn ctrl_z_then_fg_goes_on(store: &str) {
    let shell = Shell::new();
    let name = format!("fg-{store}");
    let ttl = scaled(Duration::from_secs(20));
    let job = "echo $$ > pid; while [ ! -e done ]; do sleep 0.01; done; exit 5";
    let mut first = spawn(&shell, store, ttl, &["run", &name, "--", "sh", "-c", job]);
    let distlock = first.id() as i32;
    let mut cleanup = Cleanup::default();
    cleanup.add(distlock);
    let child = eventually(scaled(Duration::from_secs(10)), "the job started", || {
        read_pid(&shell.path("pid"))
    });
    cleanup.add(child);
    signal(distlock, libc::SIGTSTP);
    eventually(act_bound(), "distlock and its job stopped", || {
        (held_still(distlock) && held_still(child)).then_some(())
    });
    signal(distlock, libc::SIGCONT);
    eventually(act_bound(), "the job going on", || {
        matches!(stat(child), Some(('S' | 'R', _))).then_some(())
    });
    std::fs::write(shell.path("done"), "").unwrap();
    let status = exit_within(&mut first, scaled(Duration::from_secs(10)), "fg");
    assert_eq!(
        status.code(),
        Some(5),
        "{status:?}: {}",
        stderr_of(&mut first)
    );
    // Passed: all gone, and their pids may be reused.
    cleanup.0.clear();
}

mod ctrl_z_then_fg_goes_on {
    #[test]
    #[cfg(feature = "sqlite")]
    fn sqlite() {
        super::ctrl_z_then_fg_goes_on("sqlite")
    }
    #[test]
    #[cfg(feature = "redis")]
    fn redis() {
        super::ctrl_z_then_fg_goes_on("redis")
    }
    #[test]
    #[cfg(feature = "postgres")]
    fn postgres() {
        super::ctrl_z_then_fg_goes_on("postgres")
    }
    #[test]
    #[cfg(feature = "etcd")]
    fn etcd() {
        super::ctrl_z_then_fg_goes_on("etcd")
    }
    #[test]
    #[cfg(feature = "zookeeper")]
    fn zookeeper() {
        super::ctrl_z_then_fg_goes_on("zookeeper")
    }
}

/// SIGTERM to distlock, its supervisor and its job at once (`systemctl
/// stop` with the default KillMode sends it to every process of the unit):
/// the supervisor does not die of it, the job runs its own handler, and the
/// run exits with the job's code.
#[test]
#[cfg(feature = "sqlite")]
fn sigterm_to_every_process_leaves_the_job_its_shutdown() {
    let shell = Shell::new();
    let job = "trap 'echo TERM > term; exit 7' TERM; echo $$ > pid; \
               while :; do sleep 0.02; done";
    let mut first = shell.spawn(&["run", "unit", "--", "sh", "-c", job]);
    let distlock = first.id() as i32;
    let mut cleanup = Cleanup::default();
    cleanup.add(distlock);
    let child = eventually(scaled(Duration::from_secs(10)), "the job started", || {
        read_pid(&shell.path("pid"))
    });
    cleanup.add(child);
    let supervisors = children(distlock);
    assert_eq!(supervisors.len(), 1, "distlock's children: {supervisors:?}");
    for pid in [distlock, supervisors[0], child] {
        // SAFETY: processes this test started; one that died already only errs.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let status = exit_within(&mut first, scaled(Duration::from_secs(10)), "SIGTERM");
    let stderr = stderr_of(&mut first);
    assert_eq!(status.code(), Some(7), "{status:?}: {stderr}");
    assert!(shell.path("term").exists(), "the job never ran its handler");
    // Passed: all gone, and their pids may be reused.
    cleanup.0.clear();
}

/// The job starts with no signal blocked, and none of the signals distlock
/// and the supervisor handle ignored, whatever the supervisor blocks for
/// itself (SIGCHLD for its signalfd, the job's and the terminal's signals):
/// a job with SIGTERM blocked would never see distlock forward it.
#[test]
#[cfg(feature = "sqlite")]
fn the_job_starts_with_no_signal_blocked_or_ignored() {
    let shell = Shell::new();
    let out = shell.output(&[
        "run",
        "mask",
        "--",
        "grep",
        "-E",
        "^Sig(Blk|Ign)",
        "/proc/self/status",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mask = |field: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_else(|| panic!("{stdout}"))
    };
    assert_eq!(mask("SigBlk:"), 0, "{stdout}");
    // Others may be ignored by distlock's own caller (nohup, a shell's `&`,
    // glibc's posix_spawn): not these.
    let handled = [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGCHLD,
        libc::SIGPIPE,
    ]
    .iter()
    .fold(0u64, |bits, &sig| bits | 1 << (sig - 1));
    assert_eq!(mask("SigIgn:") & handled, 0, "{stdout}");
}

/// The job exits and leaves a `setsid` daemon that ignores SIGTERM, with a
/// grace far longer than the TTL; distlock is then stopped (SIGSTOP, which
/// it cannot catch). The daemon dies at the lease's deadline, not after the
/// grace, and SIGCONT ends distlock with code 4 (lost).
#[test]
#[cfg(feature = "sqlite")]
fn what_a_job_leaves_dies_at_the_deadline_while_distlock_is_stopped() {
    let shell = Shell::new();
    let ttl = scaled(Duration::from_secs(2));
    let job = "echo $$ > pid; \
               (setsid sh -c 'trap \"\" TERM; echo $$ > dpid; while :; do sleep 0.02; done' \
               >/dev/null 2>&1 &); while [ ! -s dpid ]; do sleep 0.01; done; exit 0";
    let mut first = spawn(
        &shell,
        "sqlite",
        ttl,
        &["run", "--grace", "600s", "leftover", "--", "sh", "-c", job],
    );
    let distlock = first.id() as i32;
    let mut cleanup = Cleanup::default();
    cleanup.add(distlock);
    let (child, daemon) = eventually(scaled(Duration::from_secs(10)), "the job started", || {
        Some((
            read_pid(&shell.path("pid"))?,
            read_pid(&shell.path("dpid"))?,
        ))
    });
    cleanup.0.extend([child, daemon]);
    eventually(scaled(Duration::from_secs(10)), "the job's own end", || {
        (!alive(child)).then_some(())
    });
    signal(distlock, libc::SIGSTOP);
    let stopped = Instant::now();
    // The lease's local deadline is at most a TTL after the stop.
    eventually(
        ttl + act_bound(),
        "the daemon killed at the deadline",
        || (!alive(daemon)).then_some(()),
    );
    eprintln!("SIGSTOP to the daemon's end: {:?}", stopped.elapsed());
    assert!(!alive(daemon), "{}", show(daemon));
    signal(distlock, libc::SIGCONT);
    let status = exit_within(&mut first, scaled(Duration::from_secs(10)), "SIGCONT");
    assert_eq!(
        status.code(),
        Some(4),
        "{status:?}: {}",
        stderr_of(&mut first)
    );
    // Passed: all gone, and their pids may be reused.
    cleanup.0.clear();
}
