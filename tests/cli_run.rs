//! The `distlock` binary end to end, on its default lock file (a SQLite file
//! under a temp `XDG_STATE_HOME`): `run` really stops the job, two `run`s
//! never overlap, `--no-wait` is busy at once, `elect` runs its command as
//! the leader. Bounds come from the TTL and grace each test passes, scaled
//! by `LOCK_TEST_TIME_SCALE`.

#![cfg(feature = "sqlite")]

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::{Shell, alive, children, eventually, exit_within, read_pid, signal};
use lock_conformance::kit::scaled;

#[test]
fn sigterm_to_distlock_leaves_no_child_or_grandchild() {
    let shell = Shell::new();
    let (pid, gpid) = (shell.path("pid"), shell.path("gpid"));
    let script = format!(
        "echo $$ > {}; sleep 1000 & echo $! > {}; wait",
        pid.display(),
        gpid.display()
    );
    let grace = Duration::from_secs(2);
    let mut distlock = shell.spawn(&["run", "--grace", "2s", "job", "--", "sh", "-c", &script]);
    let (child, grandchild) =
        eventually(scaled(Duration::from_secs(10)), "the job started", || {
            Some((read_pid(&pid)?, read_pid(&gpid)?))
        });
    assert!(alive(child) && alive(grandchild));
    signal(distlock.id() as i32, libc::SIGTERM);
    let status = exit_within(
        &mut distlock,
        scaled(grace + Duration::from_secs(5)),
        "SIGTERM",
    );
    assert!(!status.success(), "{status:?}");
    assert!(!alive(child), "the child {child} survived");
    assert!(
        !alive(grandchild),
        "the grandchild {grandchild} survived: {:?}",
        std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
    );
    // And the lock is free again.
    let free = shell.output(&["run", "--no-wait", "job", "--", "true"]);
    assert_eq!(free.status.code(), Some(0), "{free:?}");
}

#[test]
fn an_eviction_mid_run_stops_the_job_and_exits_4() {
    let shell = Shell::new();
    let (pid, term) = (shell.path("pid"), shell.path("term"));
    let script = format!(
        "trap 'echo TERM > {}; exit 0' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        term.display(),
        pid.display()
    );
    let ttl = Duration::from_secs(4);
    let mut distlock = shell.spawn(&[
        "--ttl", "4s", "run", "--grace", "2s", "job", "--", "sh", "-c", &script,
    ]);
    let child = eventually(scaled(Duration::from_secs(10)), "the job started", || {
        read_pid(&pid)
    });
    let evict = shell.output(&["force-release", "job", "--reason", "test: stop the job"]);
    assert!(evict.status.success(), "{evict:?}");
    let evicted = Instant::now();
    let status = exit_within(&mut distlock, scaled(ttl), "eviction");
    let took = evicted.elapsed();
    assert_eq!(status.code(), Some(4), "{status:?}");
    assert!(term.exists(), "the job did not get SIGTERM");
    assert!(!alive(child));
    let mut stderr = String::new();
    std::io::Read::read_to_string(distlock.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("distlock: lease on \"job\""), "{stderr}");
    eprintln!("eviction to exit: {took:?}");
}

#[test]
fn two_runs_on_the_default_file_never_overlap() {
    let shell = Shell::new();
    let log = shell.path("log");
    // Each job writes its start and end (ns) with the fence it ran under.
    let script = format!(
        "echo \"start $(date +%s%N) $DISTLOCK_FENCE\" >> {log}; sleep 0.2; echo \"end $(date +%s%N) $DISTLOCK_FENCE\" >> {log}",
        log = log.display()
    );
    let jobs: Vec<Child> = (0..4)
        .map(|_| shell.spawn(&["--wait", "60s", "run", "nightly", "--", "sh", "-c", &script]))
        .collect();
    for mut job in jobs {
        let status = exit_within(&mut job, scaled(Duration::from_secs(60)), "concurrent runs");
        assert!(status.success(), "{status:?}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let mut spans: Vec<(u128, u128, u64)> = Vec::new();
    let mut open: std::collections::HashMap<u64, u128> = Default::default();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (at, fence): (u128, u64) = (words[1].parse().unwrap(), words[2].parse().unwrap());
        match words[0] {
            "start" => {
                open.insert(fence, at);
            }
            _ => spans.push((open.remove(&fence).unwrap(), at, fence)),
        }
    }
    assert_eq!(spans.len(), 4, "{text}");
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "two jobs overlapped: {pair:?}\n{text}"
        );
        assert!(pair[0].2 < pair[1].2, "fences out of order: {pair:?}");
    }
}

#[test]
fn no_wait_exits_75_while_held() {
    let shell = Shell::new();
    let mut holder = shell.spawn(&["hold", "job", "--for", "60s"]);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("acquired job fence="), "{line:?}");
    let busy = shell.output(&["run", "--no-wait", "job", "--", "true"]);
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("job is held (--no-wait)"), "{stderr}");
    let inspect = shell.output(&["inspect", "--json", "job"]);
    let json = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        json.starts_with("{\"name\":\"job\",\"held\":true,\"fence\":"),
        "{json}"
    );
    assert!(
        json.contains("\"label\":") && json.contains("\"expires_in_ms\":"),
        "{json}"
    );
    signal(holder.id() as i32, libc::SIGINT);
    let status = exit_within(&mut holder, scaled(Duration::from_secs(5)), "hold");
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{status:?}");
    let free = shell.output(&["inspect", "--json", "job"]);
    assert_eq!(
        String::from_utf8_lossy(&free.stdout).trim(),
        "{\"name\":\"job\",\"held\":false}"
    );
}

#[test]
fn elect_runs_the_command_as_leader_with_its_term() {
    let shell = Shell::new();
    let out = shell.output(&[
        "elect",
        "scheduler",
        "--label",
        "node-a",
        "--",
        "sh",
        "-c",
        "echo term=$DISTLOCK_TERM name=$DISTLOCK_NAME",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let term: u64 = stdout
        .trim()
        .strip_prefix("term=")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(term >= 1 && stdout.contains("name=scheduler"), "{stdout}");
}

#[test]
fn permits_give_each_run_a_slot_and_exit_codes_pass_through() {
    let shell = Shell::new();
    let out = shell.output(&[
        "run",
        "--permits",
        "2",
        "uploads",
        "--",
        "sh",
        "-c",
        "echo slot=$DISTLOCK_SLOT; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "slot=0");
    let missing = shell.output(&["run", "job", "--", "/nonexistent/command"]);
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    let bad = shell.output(&["--url", "sqlite::memory:", "inspect", "job"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert_eq!(String::from_utf8_lossy(&bad.stderr).lines().count(), 1);
}

/// `distlock` processes that create the default lock file at the same
/// moment all get in: none sees the schema half made (tables, no
/// application id yet) and takes the file for another program's.
#[test]
fn processes_creating_the_lock_file_at_once_all_get_in() {
    for round in 0..60 {
        let shell = Shell::new();
        let runs: Vec<Child> = (0..4)
            .map(|_| shell.spawn(&["inspect", "nightly"]))
            .collect();
        for mut run in runs {
            let status = exit_within(&mut run, scaled(Duration::from_secs(30)), "inspect");
            let mut stderr = String::new();
            std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            assert!(status.success(), "round {round}: {status:?}: {stderr}");
        }
    }
}

/// The default lock file under a state directory whose name holds `%`, `?`
/// and `#`: the file is made in that very directory (a URL built from the
/// path would decode `%41`, cut at `?` and open another file, or fail).
#[test]
fn a_state_dir_with_url_characters_holds_the_default_file() {
    let shell = Shell::new();
    let state = shell.path("st%41te?x=1#frag");
    let run = |args: &[&str]| {
        shell
            .distlock(args)
            .env("XDG_STATE_HOME", &state)
            .output()
            .unwrap()
    };
    let out = run(&["run", "job", "--", "true"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        state.join("distlock/locks.db").is_file(),
        "no lock file in {}",
        state.display()
    );
    assert!(!shell.path("stAte").exists());
    let schemes = run(&["schemes"]);
    let text = String::from_utf8_lossy(&schemes.stdout);
    // `schemes` shows it as a URL that `--url` opens: the same file.
    let url = text
        .lines()
        .find_map(|l| l.strip_prefix("default:\t"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        url.ends_with("st%2541te%3Fx=1%23frag/distlock/locks.db"),
        "{url}"
    );
    let mut holder = shell
        .distlock(&["hold", "job", "--for", "60s"])
        .env("XDG_STATE_HOME", &state)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("acquired job"), "{line:?}");
    let busy = run(&["--url", url, "run", "--no-wait", "job", "--", "true"]);
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    signal(holder.id() as i32, libc::SIGTERM);
    holder.wait().unwrap();
    // HOME is used the same way when XDG_STATE_HOME is unset.
    let home = shell.path("ho%2Fme?#");
    let out = shell
        .distlock(&["run", "job", "--", "true"])
        .env_remove("XDG_STATE_HOME")
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(home.join(".local/state/distlock/locks.db").is_file());
}

/// `run NAME --also NAME2`: the command runs holding both, with each
/// name's fence in its environment; `--no-wait` on a set one of whose
/// names is held exits 75 having taken none; two runs naming the same pair
/// in opposite orders both finish; the supervisor holds both names'
/// presence files, and when distlock is killed (`kill -9`) it kills the job
/// and both names are free again at once.
#[test]
fn also_holds_every_name_for_the_command() {
    let shell = Shell::new();
    let (env, pid) = (shell.path("env"), shell.path("pid"));
    let script = format!(
        "echo \"$DISTLOCK_NAME=$DISTLOCK_FENCE $DISTLOCK_NAME_1=$DISTLOCK_FENCE_1\" > {}; \
         echo $$ > {}; exec sleep 1000",
        env.display(),
        pid.display()
    );
    let mut distlock = shell.spawn(&["run", "a", "--also", "b", "--", "sh", "-c", &script]);
    let (exported, job) = eventually(scaled(Duration::from_secs(10)), "the job started", || {
        let text = std::fs::read_to_string(&env).ok()?;
        Some((text.trim().to_owned(), read_pid(&pid)?))
    });
    let fences: Vec<&str> = exported.split(' ').collect();
    for (name, pair) in ["a", "b"].iter().zip(&fences) {
        let (exported_name, fence) = pair.split_once('=').unwrap();
        assert_eq!(exported_name, *name, "{exported}");
        let inspect = shell.output(&["inspect", "--json", name]);
        let json = String::from_utf8_lossy(&inspect.stdout);
        assert!(
            json.contains(&format!("\"held\":true,\"fence\":{fence},")),
            "{name}: {json} (exported {exported})"
        );
    }
    let busy = shell.output(&["run", "--no-wait", "c", "--also", "b", "--", "true"]);
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let free_c = shell.output(&["inspect", "--json", "c"]);
    assert_eq!(
        String::from_utf8_lossy(&free_c.stdout).trim(),
        "{\"name\":\"c\",\"held\":false}",
        "the refused run kept c"
    );

    // The supervisor holds both names' presence files (SQLite: what keeps a
    // name taken while any process of the job is left, distlock dead or not).
    let supervisor = children(distlock.id() as i32)
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "distlock-sup")
        })
        .expect("distlock's supervisor");
    let presence_files = std::fs::read_dir(format!("/proc/{supervisor}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains(".db-distlock/"))
        .count();
    assert_eq!(presence_files, 2, "the supervisor's presence files");
    signal(distlock.id() as i32, libc::SIGKILL);
    let _ = exit_within(&mut distlock, scaled(Duration::from_secs(5)), "kill -9");
    eventually(scaled(Duration::from_secs(10)), "the job killed", || {
        (!alive(job)).then_some(())
    });
    // Free long before their 30 s TTL: the supervisor held the presence
    // files until no process of the job was left.
    eventually(scaled(Duration::from_secs(5)), "a and b free", || {
        let run = shell.output(&["run", "--no-wait", "a", "--also", "b", "--", "true"]);
        (run.status.code() == Some(0)).then_some(())
    });
    let runs: Vec<Child> = [["x", "y"], ["y", "x"], ["x", "y"]]
        .iter()
        .map(|[first, also]| {
            shell.spawn(&[
                "--wait", "60s", "run", first, "--also", also, "--", "sleep", "0.2",
            ])
        })
        .collect();
    for mut run in runs {
        let status = exit_within(&mut run, scaled(Duration::from_secs(60)), "the runs");
        assert!(status.success(), "{status:?}");
    }
}

/// `--shared` runs hold read shares of the reader-writer lock side by side
/// (DISTLOCK_ACCESS=read, each its own fence), `inspect --rw` shows both
/// readers, an `--exclusive` run with `--no-wait` exits 75 meanwhile, and
/// the lock of the same name stays free (a namespace apart). Once the
/// readers' distlock processes are killed (`kill -9`), their jobs die and
/// the shares are free at once (the supervisor held their presence
/// files): the `--exclusive` run gets the write, with a larger fence.
#[test]
fn shared_runs_go_side_by_side_and_exclusive_runs_alone() {
    let shell = Shell::new();
    let readers: Vec<(Child, std::path::PathBuf)> = (0..2)
        .map(|i| {
            let env = shell.path(&format!("env{i}"));
            let script = format!(
                "echo \"$DISTLOCK_ACCESS $DISTLOCK_FENCE\" > {}; exec sleep 1000",
                env.display()
            );
            let run = shell.spawn(&["run", "--shared", "report", "--", "sh", "-c", &script]);
            (run, env)
        })
        .collect();
    let mut fences = Vec::new();
    for (_, env) in &readers {
        let seen = eventually(scaled(Duration::from_secs(10)), "a reader's job", || {
            let text = std::fs::read_to_string(env).ok()?;
            text.ends_with('\n').then(|| text.trim().to_owned())
        });
        let (access, fence) = seen.split_once(' ').unwrap();
        assert_eq!(access, "read", "{seen}");
        fences.push(fence.parse::<u64>().unwrap());
    }
    let inspect = shell.output(&["inspect", "--rw", "--json", "report"]);
    let json = String::from_utf8_lossy(&inspect.stdout);
    for fence in &fences {
        assert!(
            json.contains(&format!("\"access\":\"read\",\"fence\":{fence},")),
            "{json}"
        );
    }
    let busy = shell.output(&["run", "--no-wait", "--exclusive", "report", "--", "true"]);
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let lock = shell.output(&["inspect", "--json", "report"]);
    assert!(
        String::from_utf8_lossy(&lock.stdout).contains("\"held\":false"),
        "the lock named like the reader-writer lock is apart: {lock:?}"
    );
    for (mut run, _) in readers {
        signal(run.id() as i32, libc::SIGKILL);
        let _ = exit_within(&mut run, scaled(Duration::from_secs(5)), "kill -9");
    }
    let out = shell.path("writer");
    let script = format!(
        "echo \"$DISTLOCK_ACCESS $DISTLOCK_FENCE\" > {}",
        out.display()
    );
    eventually(scaled(Duration::from_secs(5)), "the write", || {
        let run = shell.output(&[
            "run",
            "--no-wait",
            "--exclusive",
            "report",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        (run.status.code() == Some(0)).then_some(())
    });
    let written = std::fs::read_to_string(&out).unwrap();
    let (access, fence) = written.trim().split_once(' ').unwrap();
    assert_eq!(access, "write", "{written}");
    let fence: u64 = fence.parse().unwrap();
    assert!(
        fences.iter().all(|&f| fence > f),
        "{fence} after {fences:?}"
    );
}
