//! What the kernel says about this process, the store's and the machine
//! (Linux `/proc`; elsewhere these report nothing rather than guess).

use std::time::Duration;

/// CPU time (user + system) this process has used.
pub(crate) fn own_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Fields of `/proc/<pid>/stat` after the command name: index 0 is field 3
/// (state), 1 is the parent pid, 11..=14 are utime, stime, cutime, cstime.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

fn ticks(n: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(n.saturating_mul(1_000_000_000) / hz)
}

/// CPU time of the server `pid` and its children, living and reaped (a
/// PostgreSQL postmaster's backends are its children): what the store spent.
pub(crate) fn tree_cpu(pid: u32) -> Option<Duration> {
    let all = |f: &[u64]| f.get(11..15).map_or(0, |t| t.iter().sum::<u64>());
    let mut total = all(&stat_fields(pid)?);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(f) = stat_fields(child)
            && f.get(1) == Some(&u64::from(pid))
        {
            total += all(&f);
        }
    }
    Some(ticks(total))
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Hands memory freed earlier back to the kernel (glibc keeps it
/// otherwise), so an RSS reading that follows counts what is in use.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Resident memory of this process now.
pub(crate) fn rss() -> Option<u64> {
    status_kib("VmRSS:")
}

/// Peak resident memory since start or the last [`reset_peak_rss`].
pub(crate) fn peak_rss() -> Option<u64> {
    status_kib("VmHWM:")
}

/// Restarts the peak-RSS count at the current RSS (`/proc/self/clear_refs`).
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// How many descriptors of this process have `path` open (a SQLite
/// connection keeps its database file open).
#[cfg(feature = "sqlite")]
pub(crate) fn open_fds_to(path: &std::path::Path) -> Option<u64> {
    // The file may not exist yet: resolve its directory.
    let path = path.parent()?.canonicalize().ok()?.join(path.file_name()?);
    let n = std::fs::read_dir("/proc/self/fd")
        .ok()?
        .flatten()
        .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
        .count();
    Some(n as u64)
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
/// Established TCP connections whose local end is `port` (the server's
/// side of its client connections), from `/proc/net/tcp` and `tcp6`.
pub(crate) fn tcp_connections_to(port: u16) -> Option<u64> {
    let mut n = 0;
    let mut read_any = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        read_any = true;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && fields.get(3) == Some(&"01") {
                n += 1;
            }
        }
    }
    read_any.then_some(n)
}

/// `"CPU: <model>, 2 cores (available to this process); kernel 6.1.0; 7.8 GiB RAM"`.
pub(crate) fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or("unknown".into(), |kib| {
            format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0))
        });
    format!(
        "Machine: {model}, {cores} cores available; Linux {kernel}; {mem} RAM; stores on loopback, launched by the bench"
    )
}

/// "1.52 / 1.80 / 2.01".
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" / "))
        .unwrap_or_else(|| "unknown".into())
}

/// The current UTC time, "2025-01-31 12:00 UTC".
pub(crate) fn date_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// CPU time as a share of one core over `window`: "3.1% of a core".
pub(crate) fn share(cpu: Duration, window: Duration) -> String {
    format!(
        "{:.1}% of a core",
        cpu.as_secs_f64() * 100.0 / window.as_secs_f64().max(1e-9)
    )
}
