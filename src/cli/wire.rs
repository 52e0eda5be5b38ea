//! What `distlock` and its supervisor process say to each other over their
//! socket pair: one line per message, plain words and numbers, so either side
//! can be read by eye in `strace`. Both ends are on one host and one binary,
//! so there is no versioning; an unreadable line is a bug and ends the run.

use std::fmt;
use std::time::Duration;

/// The argument that starts the hidden supervisor mode: `distlock
/// __distlock-supervisor CONTROL_FD PRESENCE_FD|- GRACE_MS DEADLINE_NS --
/// COMMAND...`. Not a subcommand, so `--help` never shows it.
pub(crate) const SUPERVISOR_ARG: &str = "__distlock-supervisor";

/// From `distlock` to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Kill every descendant if the boot clock (`CLOCK_BOOTTIME`, in ns)
    /// reaches this before another deadline comes: the lease's local deadline.
    Deadline(u64),
    /// Send this signal to the job's process group.
    Signal(i32),
    /// Stop every descendant (job control: distlock is about to stop).
    Stop,
    /// Continue every descendant.
    Cont,
    /// The lease is lost: SIGTERM to every descendant, SIGKILL after the grace.
    End(Duration),
    /// SIGKILL every descendant now.
    Kill,
}

/// From the supervisor to `distlock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// The job runs, with this pid (and process group).
    Started(i32),
    /// The job could not be started: whether the program was not found, and why.
    SpawnFailed { not_found: bool, why: String },
    /// The job (the direct child) ended with this wait status.
    Exited(i32),
    /// The deadline passed without a new one: every descendant was killed.
    Expired,
    /// No descendant is left; the supervisor exits next.
    Done,
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Order::Deadline(ns) => write!(f, "deadline {ns}"),
            Order::Signal(sig) => write!(f, "signal {sig}"),
            Order::Stop => f.write_str("stop"),
            Order::Cont => f.write_str("cont"),
            Order::End(grace) => write!(f, "end {}", grace.as_millis()),
            Order::Kill => f.write_str("kill"),
        }
    }
}

impl Order {
    /// Reads one line (without its newline).
    pub(crate) fn parse(line: &str) -> Option<Order> {
        let (word, arg) = line.split_once(' ').unwrap_or((line, ""));
        Some(match word {
            "deadline" => Order::Deadline(arg.parse().ok()?),
            "signal" => Order::Signal(arg.parse().ok()?),
            "stop" => Order::Stop,
            "cont" => Order::Cont,
            "end" => Order::End(Duration::from_millis(arg.parse().ok()?)),
            "kill" => Order::Kill,
            _ => return None,
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Started(pid) => write!(f, "started {pid}"),
            Report::SpawnFailed { not_found, why } => {
                // One line whatever the error says.
                let why = why.replace(['\n', '\r'], " ");
                write!(f, "failed {} {why}", u8::from(*not_found))
            }
            Report::Exited(status) => write!(f, "exited {status}"),
            Report::Expired => f.write_str("expired"),
            Report::Done => f.write_str("done"),
        }
    }
}

impl Report {
    /// Reads one line (without its newline).
    pub(crate) fn parse(line: &str) -> Option<Report> {
        let (word, arg) = line.split_once(' ').unwrap_or((line, ""));
        Some(match word {
            "started" => Report::Started(arg.parse().ok()?),
            "failed" => {
                let (flag, why) = arg.split_once(' ').unwrap_or((arg, ""));
                Report::SpawnFailed {
                    not_found: flag == "1",
                    why: why.to_owned(),
                }
            }
            "exited" => Report::Exited(arg.parse().ok()?),
            "expired" => Report::Expired,
            "done" => Report::Done,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back() {
        for order in [
            Order::Deadline(u64::MAX),
            Order::Signal(15),
            Order::Stop,
            Order::Cont,
            Order::End(Duration::from_millis(1500)),
            Order::Kill,
        ] {
            assert_eq!(Order::parse(&order.to_string()), Some(order));
        }
        for report in [
            Report::Started(42),
            Report::SpawnFailed {
                not_found: true,
                why: "No such file".into(),
            },
            Report::Exited(256),
            Report::Expired,
            Report::Done,
        ] {
            assert_eq!(Report::parse(&report.to_string()), Some(report));
        }
        assert_eq!(Order::parse("deadline soon"), None);
        assert_eq!(Report::parse("hello"), None);
    }
}
