//! What a process uses (CPU time, memory), for tests that state what work
//! costs (Linux `/proc`).

use std::time::Duration;

/// User + system CPU time of process `pid` so far; zero if it cannot be read.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime
    // are the 14th and 15th fields of the line, in clock ticks
    // (sysconf(_SC_CLK_TCK) is 100 on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// [`cpu_time`] of this process.
pub fn own_cpu_time() -> Duration {
    cpu_time(std::process::id())
}

/// This process's memory from `/proc/self/status` in MiB: `"VmRSS:"` (resident
/// now) or `"VmHWM:"` (the peak); zero if it cannot be read.
pub fn own_memory_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_work_shows_up() {
        let before = own_cpu_time();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(
            own_cpu_time() > before,
            "300 ms of spinning cost no CPU time"
        );
    }

    #[test]
    fn memory_is_read() {
        assert!(own_memory_mib("VmRSS:") > 0.0);
        assert!(own_memory_mib("VmHWM:") >= own_memory_mib("VmRSS:") - 1.0);
    }
}
