//! A `distlock` that gives up on a lock leaves nothing behind on the store,
//! even though it exits at once, on every store: the default SQLite file and
//! Redis, PostgreSQL, etcd and ZooKeeper launched by the kit. A `--wait` that
//! runs out (exit 3), `--no-wait` on a held name (75), SIGTERM to a waiting
//! `run` (143) and SIGINT to a waiting `hold` (130) each leave `inspect`
//! showing only the holder; once the holder is evicted, `run --no-wait` is
//! granted at once, not after the TTL of an entry a dead waiter left queued.
//!
//! The TTL is long (30 s) so that a leftover entry is never mistaken for a
//! free name; every other bound is scaled, and every wait polls.

#![cfg(target_os = "linux")]

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::store::{Store, ms, output, spawn};
use common::{Cleanup, Collected, Shell, eventually, exit_within, signal};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;

/// Long enough that an entry left behind still blocks the name when checked.
const TTL: Duration = Duration::from_secs(30);

/// The bound `distlock` documents on its clean-up when the store hangs.
const CLOSE_BOUND: Duration = Duration::from_secs(10);

/// How long `distlock` may take to exit once it gave up: its clean-up's
/// bound and room for the process to end; a live store answers in far less.
fn exit_bound() -> Duration {
    CLOSE_BOUND + scaled(Duration::from_secs(2))
}

/// `inspect --json NAME`'s line.
fn inspect(shell: &Shell, store: Store, name: &str) -> String {
    let out = output(shell, store, TTL, &["inspect", "--json", name]);
    assert!(out.status.success(), "inspect: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Fails unless `inspect` shows the first holder, and only it.
fn assert_only_the_holder(shell: &Shell, store: Store, name: &str, fence: u64, after: &str) {
    let seen = inspect(shell, store, name);
    assert!(
        seen.contains("\"held\":true")
            && seen.contains(&format!("\"fence\":{fence},"))
            && seen.contains("\"label\":\"first\""),
        "{store:?}: after {after}, inspect shows {seen}, not the first holder (fence {fence})"
    );
}

/// Starts `distlock [ARGS]` waiting for the lock with its debug log on, and
/// returns once it has waited for a while: past its "waiting" line by the
/// time a whole `inspect` takes (a connect and a request) plus 200 ms, the
/// `--wait` the report gave up after, so its attempt is queued.
fn waiting(shell: &Shell, args: &[String], round: Duration) -> (Child, Collected) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = shell
        .distlock(&args)
        .env("DISTLOCK_LOG", "distlock=debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Collected::new(child.stderr.take().unwrap());
    eventually(
        scaled(Duration::from_secs(20)),
        "the waiter waiting",
        || stderr.text().contains("waiting for the lock").then_some(()),
    );
    std::thread::sleep(round + scaled(Duration::from_millis(200)));
    (child, stderr)
}

fn a_waiter_that_gives_up_leaves_nothing(store: Store) {
    let shell = Shell::new();
    let name = format!("exit-{store:?}");
    let mut cleanup = Cleanup::default();
    let mut holder = spawn(
        &shell,
        store,
        TTL,
        &["hold", &name, "--for", "600s", "--label", "first"],
    );
    cleanup.add(holder.id() as i32);
    let said = Collected::new(holder.stdout.take().unwrap());
    let fence: u64 = eventually(scaled(Duration::from_secs(20)), "the holder", || {
        let text = said.text();
        text.split_once(" fence=")?
            .1
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    });
    let asked = Instant::now();
    assert_only_the_holder(&shell, store, &name, fence, "the holder took it");
    let round = asked.elapsed();

    // (a) --wait runs out.
    let started = Instant::now();
    let timed_out = output(
        &shell,
        store,
        TTL,
        &[
            "--wait", "200ms", "run", "--label", "waiter-a", &name, "--", "true",
        ],
    );
    let took = started.elapsed();
    assert_eq!(timed_out.status.code(), Some(3), "{timed_out:?}");
    eprintln!("{store:?}: --wait 200ms gave up and exited in {took:?}");
    assert_only_the_holder(&shell, store, &name, fence, "a --wait that ran out");

    // --no-wait on the held name.
    let busy = output(
        &shell,
        store,
        TTL,
        &[
            "run",
            "--no-wait",
            "--label",
            "waiter-n",
            &name,
            "--",
            "true",
        ],
    );
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    assert_only_the_holder(&shell, store, &name, fence, "--no-wait");

    // (b) SIGTERM to a waiting run, SIGINT to a waiting hold.
    for (sig, args) in [
        (
            libc::SIGTERM,
            vec![
                "--wait", "60s", "run", "--label", "waiter-b", &name, "--", "true",
            ],
        ),
        (
            libc::SIGINT,
            vec!["--wait", "60s", "hold", "--label", "waiter-c", &name],
        ),
    ] {
        let (mut waiter, stderr) = waiting(&shell, &store.args(TTL, &args), round);
        cleanup.add(waiter.id() as i32);
        let sent = Instant::now();
        signal(waiter.id() as i32, sig);
        let status = exit_within(&mut waiter, exit_bound(), "signalled while waiting");
        eprintln!(
            "{store:?}: {} exited {:?} in {:?} after signal {sig}",
            args[2],
            status.code(),
            sent.elapsed()
        );
        assert_eq!(
            status.code(),
            Some(128 + sig),
            "{status:?}: {}",
            stderr.text()
        );
        assert_only_the_holder(
            &shell,
            store,
            &name,
            fence,
            &format!("signal {sig} to a waiting {}", args[2]),
        );
    }

    // (c) Evicted, the holder's name is free at once: nobody is queued.
    let evict = output(
        &shell,
        store,
        TTL,
        &[
            "force-release",
            &name,
            "--fence",
            &fence.to_string(),
            "--reason",
            "test",
        ],
    );
    assert!(evict.status.success(), "{evict:?}");
    let free = output(
        &shell,
        store,
        TTL,
        &["run", "--no-wait", "--label", "next", &name, "--", "true"],
    );
    assert_eq!(
        free.status.code(),
        Some(0),
        "{store:?}: not granted at once after the eviction ({}); {free:?}",
        inspect(&shell, store, &name)
    );
    let (enforced, slack) = store.declared(TTL);
    let status = exit_within(
        &mut holder,
        enforced + slack + scaled(Duration::from_secs(5)),
        "the evicted holder",
    );
    assert_eq!(status.code(), Some(4), "{status:?}");
    cleanup.0.clear();
    eprintln!(
        "{store:?}: fence {fence}, one inspect {round:?}, TTL {}",
        ms(TTL)
    );
}

/// A store that stops answering while `distlock` waits (its link frozen by
/// the fault proxy: connections open, nothing forwarded): SIGTERM still
/// ends it within the clean-up's bound, exit 143. The default SQLite file
/// has no link to freeze.
fn a_hung_store_delays_the_exit_by_at_most_the_bound(store: Store) {
    if store == Store::Sqlite {
        return;
    }
    let kit = store.kit().expect("a launched store");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let proxy = runtime
        .block_on(FaultProxy::start(kit.addr()))
        .expect("fault proxy");
    let shell = Shell::new();
    let name = format!("hung-{store:?}");
    let mut cleanup = Cleanup::default();
    let mut holder = spawn(&shell, store, TTL, &["hold", &name, "--for", "600s"]);
    cleanup.add(holder.id() as i32);
    let said = Collected::new(holder.stdout.take().unwrap());
    eventually(scaled(Duration::from_secs(20)), "the holder", || {
        said.text().contains("acquired").then_some(())
    });
    let asked = Instant::now();
    inspect(&shell, store, &name);
    let round = asked.elapsed();
    let mut args = vec![
        "--ttl".to_owned(),
        ms(TTL),
        "--url".to_owned(),
        store.url_via(TTL, proxy.addr()).unwrap(),
    ];
    args.extend(["--wait", "60s", "run", &name, "--", "true"].map(String::from));
    let (mut waiter, stderr) = waiting(&shell, &args, round);
    cleanup.add(waiter.id() as i32);
    proxy.set(Mode::Freeze);
    let sent = Instant::now();
    signal(waiter.id() as i32, libc::SIGTERM);
    let status = exit_within(&mut waiter, exit_bound(), "SIGTERM with the store hung");
    let took = sent.elapsed();
    eprintln!("{store:?}: hung store, SIGTERM to exit: {took:?}");
    assert_eq!(status.code(), Some(143), "{status:?}: {}", stderr.text());
    proxy.set(Mode::Pass);
    signal(holder.id() as i32, libc::SIGTERM);
    let status = exit_within(&mut holder, exit_bound(), "the holder");
    assert_eq!(status.code(), Some(143), "{status:?}");
    cleanup.0.clear();
}

crate::on_every_store!(
    a_waiter_that_gives_up_leaves_nothing,
    a_hung_store_delays_the_exit_by_at_most_the_bound,
);
