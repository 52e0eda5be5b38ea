//! `distlock run` never lets its job outlive it, on every store: the
//! default SQLite file and Redis, PostgreSQL, etcd and ZooKeeper launched by
//! the kit. `kill -9` of distlock kills the job and what it started at once
//! (and on SQLite keeps the lock taken until they are gone); Ctrl-Z stops the
//! job with distlock, and the lease's deadline kills it while distlock is
//! stopped; a double-forked `setsid` daemon is no escape; a killed supervisor
//! takes the job with it and the lock is released.
//!
//! Bounds come from the TTL each test passes and the store's declared expiry
//! slack, scaled by `LOCK_TEST_TIME_SCALE`; every wait polls.

#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::store::{Store, ms, output, spawn};
use common::{
    Cleanup, Shell, alive, eventually, exit_within, held_still, read_pid, show, signal, stat,
    stderr_of,
};
use lock_conformance::kit::scaled;

/// A shell line for a second job: prints `ALIVE pid state` for each of
/// `pids` that is still a live process, then `checked`.
fn check_gone(pids: &[i32]) -> String {
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    format!(
        "for p in {}; do s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); \
         if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo \"ALIVE $p $s\"; fi; done; echo checked",
        list.join(" ")
    )
}

/// A job with a backgrounded grandchild: `pid` and `gpid` in the cwd.
const JOB: &str = "echo $$ > pid; sleep 1000 & echo $! > gpid; wait";

/// How soon the supervisor must have killed everything once told: far
/// below every TTL here.
fn kill_bound() -> Duration {
    scaled(Duration::from_millis(1500))
}

fn started(shell: &Shell) -> (i32, i32) {
    eventually(scaled(Duration::from_secs(10)), "the job started", || {
        Some((
            read_pid(&shell.path("pid"))?,
            read_pid(&shell.path("gpid"))?,
        ))
    })
}

fn assert_all_dead_within(pids: &[i32], within: Duration, what: &str) -> Duration {
    let from = Instant::now();
    let survivors = || {
        pids.iter()
            .copied()
            .filter(|&p| alive(p))
            .collect::<Vec<_>>()
    };
    let give_up = from + within;
    loop {
        let left = survivors();
        if left.is_empty() {
            return from.elapsed();
        }
        assert!(
            Instant::now() < give_up,
            "{what}: still alive after {within:?}: {:?}",
            left.iter().map(|&p| show(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(lock_conformance::kit::poll::interval());
    }
}

/// `kill -9` of distlock: the shell and its backgrounded grandchild die at
/// once, and a second `run` that gets the lock never sees them; on SQLite
/// even a `--no-wait` right after the kill.
fn kill_9_of_distlock_kills_the_whole_job(store: Store) {
    let shell = Shell::new();
    let name = format!("kill9-{store:?}");
    let ttl = scaled(Duration::from_secs(3));
    assert!(kill_bound() < ttl);
    let mut first = spawn(&shell, store, ttl, &["run", &name, "--", "sh", "-c", JOB]);
    let mut cleanup = Cleanup::default();
    cleanup.add(first.id() as i32);
    let (child, grandchild) = started(&shell);
    cleanup.0.extend([child, grandchild]);
    let check = check_gone(&[child, grandchild]);
    signal(first.id() as i32, libc::SIGKILL);
    first.wait().unwrap();
    let killed = Instant::now();
    let mut second = if store == Store::Sqlite {
        // Right away: busy (75) while anything of the first job is left,
        // else granted, and then nothing of it may be alive.
        let now = output(
            &shell,
            store,
            ttl,
            &["run", "--no-wait", &name, "--", "sh", "-c", &check],
        );
        let stdout = String::from_utf8_lossy(&now.stdout);
        match now.status.code() {
            Some(0) => assert!(
                !stdout.contains("ALIVE"),
                "granted beside the first job: {stdout}"
            ),
            Some(75) => {}
            _ => panic!("{now:?}"),
        }
        None
    } else {
        let wait = ms(store.takeover_wait(ttl));
        Some(spawn(
            &shell,
            store,
            ttl,
            &["--wait", &wait, "run", &name, "--", "sh", "-c", &check],
        ))
    };
    let took = assert_all_dead_within(
        &[child, grandchild],
        kill_bound(),
        "after kill -9 of distlock",
    );
    eprintln!(
        "{store:?}: kill -9 to no process of the job left: {:?}",
        killed.elapsed().max(took)
    );
    let after = match second.as_mut() {
        Some(second) => {
            let status = exit_within(second, store.takeover_wait(ttl) + ttl, "second run");
            let mut stdout = String::new();
            std::io::Read::read_to_string(second.stdout.as_mut().unwrap(), &mut stdout).unwrap();
            (status, stdout)
        }
        None => eventually(kill_bound(), "the lock free again", || {
            let out = output(
                &shell,
                store,
                ttl,
                &["run", "--no-wait", &name, "--", "sh", "-c", &check],
            );
            (out.status.code() == Some(0)).then(|| {
                (
                    out.status,
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                )
            })
        }),
    };
    assert!(after.0.success(), "{after:?}");
    assert_eq!(
        after.1.trim(),
        "checked",
        "the second job saw the first one alive"
    );
    // Passed: all gone, and their pids may be reused.
    cleanup.0.clear();
}

/// Ctrl-Z (SIGTSTP) to distlock stops the job's processes with it; the
/// supervisor kills them at the lease's local deadline; a second `run`
/// granted after the TTL runs alone; SIGCONT to the first distlock then
/// ends it with code 4, its job never having run again.
fn ctrl_z_stops_the_job_and_the_deadline_kills_it(store: Store) {
    let shell = Shell::new();
    let name = format!("tstp-{store:?}");
    let ttl = scaled(Duration::from_secs(2));
    let job =
        "echo $$ > pid; sleep 1000 & echo $! > gpid; while :; do echo t >> ticks; sleep 0.02; done";
    let mut first = spawn(&shell, store, ttl, &["run", &name, "--", "sh", "-c", job]);
    let mut cleanup = Cleanup::default();
    cleanup.add(first.id() as i32);
    let (child, grandchild) = started(&shell);
    cleanup.0.extend([child, grandchild]);
    let ticks = || std::fs::read_to_string(shell.path("ticks")).map_or(0, |t| t.lines().count());
    eventually(scaled(Duration::from_secs(5)), "the job ticking", || {
        (ticks() > 0).then_some(())
    });
    signal(first.id() as i32, libc::SIGTSTP);
    let stopped = Instant::now();
    let state = |pid: i32| stat(pid).map(|(s, _)| s);
    let watched = [first.id() as i32, child, grandchild];
    let states = || watched.map(state);
    let mut seen = Vec::new();
    let all_stopped = lock_conformance::kit::poll::blocking(kill_bound(), "stopped", || {
        let now = states();
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        Ok::<_, lock_conformance::kit::poll::TimedOut>(
            watched.iter().all(|&p| held_still(p)).then_some(()),
        )
    });
    assert!(
        all_stopped.is_ok(),
        "distlock and its job (distlock, sh, sleep) not all stopped within {:?}; states seen: {seen:?}",
        kill_bound()
    );
    let frozen = ticks();
    // The lease's local deadline is at most a TTL (as enforced) after the stop.
    let (enforced, _) = store.declared(ttl);
    let took = assert_all_dead_within(
        &[child, grandchild],
        enforced + kill_bound(),
        "at the lease deadline",
    );
    eprintln!(
        "{store:?}: Ctrl-Z to job killed: {took:?} (TTL {enforced:?}, {:?} since the stop)",
        stopped.elapsed()
    );
    assert_eq!(
        state(first.id() as i32),
        Some('T'),
        "distlock itself stays stopped"
    );
    let check = check_gone(&[child, grandchild]);
    let wait = ms(store.takeover_wait(ttl));
    let second = output(
        &shell,
        store,
        ttl,
        &["--wait", &wait, "run", &name, "--", "sh", "-c", &check],
    );
    assert!(second.status.success(), "{second:?}");
    assert_eq!(String::from_utf8_lossy(&second.stdout).trim(), "checked");
    signal(first.id() as i32, libc::SIGCONT);
    let status = exit_within(&mut first, scaled(Duration::from_secs(10)), "SIGCONT");
    let stderr = stderr_of(&mut first);
    assert_eq!(status.code(), Some(4), "{status:?}: {stderr}");
    assert_eq!(ticks(), frozen, "job 1 ran after its stop");
    // Passed: all gone, and their pids may be reused.
    cleanup.0.clear();
}

/// A job that double-forks a `setsid` daemon (another session and process
/// group): killed with the job when distlock is killed, and stopped (TERM)
/// before distlock exits when the job exits first.
fn a_setsid_daemon_is_killed_with_the_job(store: Store) {
    let shell = Shell::new();
    let name = format!("setsid-{store:?}");
    let job = "(setsid sh -c 'echo $$ > dpid; exec sleep 1000' &); echo $$ > pid; \
               while [ ! -s dpid ]; do sleep 0.01; done; exec sleep 1000";
    let ttl = scaled(Duration::from_secs(3));
    let mut first = spawn(&shell, store, ttl, &["run", &name, "--", "sh", "-c", job]);
    let mut cleanup = Cleanup::default();
    cleanup.add(first.id() as i32);
    let (child, daemon) = eventually(
        scaled(Duration::from_secs(10)),
        "the daemon started",
        || {
            Some((
                read_pid(&shell.path("pid"))?,
                read_pid(&shell.path("dpid"))?,
            ))
        },
    );
    cleanup.0.extend([child, daemon]);
    // SAFETY: getsid and getpgid only read.
    let (sid, group) = unsafe { (libc::getsid(daemon), libc::getpgid(daemon)) };
    assert!(
        sid == daemon && group != child,
        "the daemon did not escape the job's group"
    );
    signal(first.id() as i32, libc::SIGKILL);
    first.wait().unwrap();
    assert_all_dead_within(&[child, daemon], kill_bound(), "after kill -9 of distlock");

    // The job exits and leaves its daemon behind: distlock stops it first.
    let job = "(setsid sh -c 'echo $$ > dpid2; exec sleep 1000' &); \
               while [ ! -s dpid2 ]; do sleep 0.01; done; exit 3";
    let grace = scaled(Duration::from_secs(2));
    let name = format!("{name}-exits");
    let mut second = spawn(
        &shell,
        store,
        ttl,
        &["run", "--grace", &ms(grace), &name, "--", "sh", "-c", job],
    );
    let status = exit_within(&mut second, grace + scaled(Duration::from_secs(10)), "exit");
    assert_eq!(
        status.code(),
        Some(3),
        "{status:?}: {}",
        stderr_of(&mut second)
    );
    let daemon = read_pid(&shell.path("dpid2")).unwrap();
    assert!(
        !alive(daemon),
        "the daemon outlived distlock: {}",
        show(daemon)
    );
    // Passed: all gone, and their pids may be reused.
    cleanup.0.clear();
}

/// `kill -9` of the supervisor: distlock kills the job, exits 70 saying so,
/// and releases the lock.
fn a_killed_supervisor_takes_the_job_and_frees_the_lock(store: Store) {
    let shell = Shell::new();
    let name = format!("supervisor-{store:?}");
    let ttl = Duration::from_secs(30);
    let mut first = spawn(&shell, store, ttl, &["run", &name, "--", "sh", "-c", JOB]);
    let mut cleanup = Cleanup::default();
    cleanup.add(first.id() as i32);
    let (child, grandchild) = started(&shell);
    cleanup.0.extend([child, grandchild]);
    let (_, supervisor) = stat(child).expect("the job's stat");
    assert_ne!(
        supervisor,
        first.id() as i32,
        "no supervisor between distlock and the job"
    );
    signal(supervisor, libc::SIGKILL);
    let status = exit_within(
        &mut first,
        scaled(Duration::from_secs(5)),
        "supervisor killed",
    );
    let stderr = stderr_of(&mut first);
    assert_eq!(status.code(), Some(70), "{status:?}: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("supervisor") && last.contains("killed"),
        "{stderr}"
    );
    assert!(
        !alive(child) && !alive(grandchild),
        "{} / {}",
        show(child),
        show(grandchild)
    );
    let free = output(
        &shell,
        store,
        ttl,
        &["run", "--no-wait", &name, "--", "true"],
    );
    assert_eq!(free.status.code(), Some(0), "{free:?}");
    // Passed: all gone, and their pids may be reused.
    cleanup.0.clear();
}

// One test per store for each case above.
crate::on_every_store!(
    kill_9_of_distlock_kills_the_whole_job,
    ctrl_z_stops_the_job_and_the_deadline_kills_it,
    a_setsid_daemon_is_killed_with_the_job,
    a_killed_supervisor_takes_the_job_and_frees_the_lock,
);
