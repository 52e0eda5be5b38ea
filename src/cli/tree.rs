//! A process's subtree, read from `/proc`, and the boot clock: what the
//! supervisor (and `distlock`, when the supervisor is gone) needs to stop
//! everything a job started, however it detached itself.
//!
//! Both callers are child subreapers (`PR_SET_CHILD_SUBREAPER`): an orphaned
//! descendant, even one that double-forked and called `setsid`, is re-parented
//! to them instead of to init, so it stays in the subtree a scan finds, and
//! "no child left" (`waitpid` answers `ECHILD`) means no descendant left.

use std::collections::HashMap;
use std::io;

/// Makes this process a child subreaper: orphaned descendants come back to it.
pub(crate) fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The live (not zombie) descendants of `root`, parents before children.
/// A scan is a snapshot: processes forked during it may be missed, so
/// callers repeat until nothing is left.
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // ppid -> [(pid, live)]
    let mut children: HashMap<i32, Vec<(i32, bool)>> = HashMap::new();
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold anything, so read after
        // its last parenthesis.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("X");
        let Some(ppid) = fields.next().and_then(|f| f.parse::<i32>().ok()) else {
            continue;
        };
        children
            .entry(ppid)
            .or_default()
            .push((pid, state != "Z" && state != "X"));
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(parent) = next.pop() {
        for &(pid, live) in children.get(&parent).map_or(&[][..], Vec::as_slice) {
            if pid == root {
                continue;
            }
            if live {
                found.push(pid);
            }
            next.push(pid);
        }
    }
    found
}

/// Sends `sig` to every live descendant of `root` found by one scan, and
/// returns how many there were.
pub(crate) fn signal_descendants(root: i32, sig: i32) -> usize {
    let found = descendants(root);
    for &pid in &found {
        // SAFETY: kill has no memory arguments; a pid gone since the scan only errs.
        unsafe { libc::kill(pid, sig) };
    }
    found.len()
}

/// Sends `sig` to process group `group` (a gone group only errs).
pub(crate) fn signal_group(group: i32, sig: i32) {
    // SAFETY: killpg has no memory arguments.
    unsafe { libc::killpg(group, sig) };
}

/// Reaps every child that has ended. Returns the ended children with their
/// wait status, and whether no child at all is left (`ECHILD`).
pub(crate) fn reap() -> (Vec<(i32, i32)>, bool) {
    let mut ended = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into our local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        match pid {
            0 => return (ended, false),
            -1 => {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // ECHILD: nobody left.
                    _ => return (ended, true),
                }
            }
            pid => ended.push((pid, status)),
        }
    }
}

/// Nanoseconds on `CLOCK_BOOTTIME`: the monotonic clock plus time the host
/// spent suspended, shared by every process of the host.
pub(crate) fn boot_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into our local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_grandchild_and_not_itself() {
        let me = std::process::id() as i32;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            let found = descendants(me);
            if found.len() >= 2 || std::time::Instant::now() > give_up {
                break found;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(found.contains(&(child.id() as i32)), "{found:?}");
        assert!(!found.contains(&me));
        assert!(found.len() >= 2, "{found:?}");
        // Only the child's own subtree: other tests of this binary run beside.
        assert!(signal_descendants(child.id() as i32, libc::SIGKILL) >= 1);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(boot_now() > 0);
    }
}
