//! What the kit asks of a launched etcd through `etcdctl`: a snapshot, a
//! restore from one, authentication turned on.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::super::{Kind, Store};

/// Saves a snapshot of a launched plaintext `store` to `to` (`etcdctl
/// snapshot save`), for restore tests.
pub fn snapshot(store: &Store, to: &Path) -> io::Result<()> {
    let mut cmd = etcdctl()?;
    cmd.arg("--endpoints")
        .arg(store.endpoint())
        .args(["--dial-timeout", "5s", "--command-timeout", "60s"])
        .args(["snapshot", "save"])
        .arg(to);
    run(cmd, "etcdctl snapshot save")
}

/// Restores a launched single-member `store` from `snapshot`: stops it,
/// restores the snapshot into a new data dir in place of its own (`etcdctl
/// snapshot restore`, same member name and peer URL) and starts it again on
/// the same ports: what an operator does after losing a cluster.
pub fn restore(store: &Store, snapshot: &Path) -> io::Result<()> {
    let pid = store
        .pid()
        .ok_or_else(|| io::Error::other("the store to restore is not running"))?;
    // Its own command line says where its data lives and who it is.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .ok_or_else(|| {
                io::Error::other(format!("{name} missing from the store's command line"))
            })
    };
    let (name, data, peer) = (
        flag("--name")?,
        PathBuf::from(flag("--data-dir")?),
        flag("--initial-advertise-peer-urls")?,
    );
    store.stop_now()?;
    std::fs::remove_dir_all(&data)?;
    let mut cmd = etcdctl()?;
    cmd.args(["snapshot", "restore"])
        .arg(snapshot)
        .arg("--data-dir")
        .arg(&data)
        .args(["--name", &name])
        .args(["--initial-cluster", &format!("{name}={peer}")])
        .args(["--initial-advertise-peer-urls", &peer]);
    run(cmd, "etcdctl snapshot restore")?;
    store.restart_now()
}

/// Adds the `root` user with `password` and turns authentication on.
pub(super) fn enable_auth(store: &Store, password: &str) -> io::Result<()> {
    let ctl = |args: &[&str]| -> io::Result<()> {
        let mut cmd = etcdctl()?;
        cmd.arg("--endpoints")
            .arg(store.endpoint())
            .args(["--dial-timeout", "5s", "--command-timeout", "10s"])
            .args(args);
        run(cmd, "etcdctl (enabling auth)")
    };
    ctl(&[
        "user",
        "add",
        "root",
        "--interactive=false",
        &format!("--new-user-password={password}"),
    ])?;
    ctl(&["user", "grant-role", "root", "root"])?;
    ctl(&["auth", "enable"])
}

fn etcdctl() -> io::Result<Command> {
    let program = super::super::which("etcdctl")
        .ok_or_else(|| super::super::missing(Kind::Etcd, "etcdctl"))?;
    let mut cmd = Command::new(program);
    cmd.env("ETCDCTL_API", "3");
    Ok(cmd)
}

fn run(mut cmd: Command, what: &str) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
