//! `distlock`: take, inspect and break locks from the shell.
//!
//! ```text
//! distlock --url redis://127.0.0.1:6379 run nightly-settlement -- ./settle.sh
//! distlock --url postgres://... inspect nightly-settlement
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::{LockError, Locker};

#[derive(Parser, Debug)]
#[command(
    name = "distlock",
    version,
    about = "Safe distributed locks from the shell"
)]
struct Cli {
    /// Lock store URL (memory://, redis://, rediss://, postgres://, etcd://, zk://: see `distlock schemes`).
    #[arg(
        long,
        env = "DISTLOCK_URL",
        default_value = "memory://",
        hide_env_values = true
    )]
    url: String,
    /// Lease TTL, e.g. 30s, 500ms.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How long to wait for the lock.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    wait: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding the lock; it gets DISTLOCK_FENCE in its
    /// environment and is killed if the lease is lost.
    Run {
        /// Lock name.
        name: String,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Take the lock, print its fencing token, hold it for a while, release.
    Hold {
        /// Lock name.
        name: String,
        /// How long to hold it.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        r#for: Duration,
    },
    /// Show who holds a lock.
    Inspect {
        /// Lock name.
        name: String,
    },
    /// Evict whoever holds a lock (audited; the next holder gets a larger fence).
    ForceRelease {
        /// Lock name.
        name: String,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: String,
        /// Evict only the holder with this fencing token (as `inspect`
        /// showed it), so a retry never evicts the next holder.
        #[arg(long)]
        fence: Option<u64>,
    },
    /// List the URL schemes this build supports.
    Schemes,
}

/// Exit codes: 0 ok, 1 error, 2 usage (clap), 3 timed out waiting, 4 lease
/// lost while running, else the child's own code.
const TIMED_OUT: u8 = 3;
const LOST: u8 = 4;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DISTLOCK_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("distlock: {e}");
            ExitCode::from(match e {
                LockError::Timeout { .. } => TIMED_OUT,
                LockError::Lost { .. } => LOST,
                _ => 1,
            })
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, LockError> {
    if let Command::Schemes = cli.command {
        for (scheme, feature) in distlock::SCHEMES {
            println!("{scheme}://\t{feature}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let backend = distlock::connect(&cli.url).await?;
    let locker = Locker::from_arc(backend.clone())
        .ttl(cli.ttl)
        .max_wait(cli.wait);
    match cli.command {
        Command::Run { name, command } => run_locked(&locker, &name, &command).await,
        Command::Hold { name, r#for } => {
            let guard = locker.acquire(&name).await?;
            println!("acquired {name} fence={}", guard.fencing_token());
            tokio::select! {
                reason = guard.lost() => {
                    return Err(LockError::Lost { name: guard.name(), fence: guard.fencing_token(), reason });
                }
                _ = tokio::time::sleep(r#for) => {}
            }
            match guard.release().await? {
                distlock::ReleaseOutcome::Released => println!("released {name}"),
                distlock::ReleaseOutcome::NotHeld => {
                    eprintln!("distlock: {name} was no longer held at release (lease lost)");
                    return Ok(ExitCode::from(LOST));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { name } => {
            let name = distlock::LockName::new(name)?;
            match backend.inspect(&name).await? {
                Some(h) => println!(
                    "{name}: held, fence={}, owner={}, expires_in={}",
                    h.fence,
                    h.owner.map_or("?".into(), |o| o.to_string()),
                    h.expires_in.map_or("session".into(), |d| format!("{d:?}"))
                ),
                None => println!("{name}: free"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::ForceRelease {
            name,
            reason,
            fence,
        } => {
            let name = distlock::LockName::new(name)?;
            let evicted = match fence {
                None => locker.force_release(&name, &reason).await?,
                Some(fence) => {
                    let fence = distlock::FencingToken::new(fence)
                        .ok_or_else(|| LockError::config("--fence must be at least 1"))?;
                    locker.force_release_if(&name, fence, &reason).await?
                }
            };
            match (evicted, fence) {
                (Some(h), _) => println!("{name}: evicted holder with fence {}", h.fence),
                (None, None) => println!("{name}: was free"),
                (None, Some(f)) => println!("{name}: not held under fence {f}; nothing evicted"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Schemes => unreachable!("handled above"),
    }
}

/// Runs `command` under the lock and kills it if the lease is lost.
async fn run_locked(
    locker: &Locker,
    name: &str,
    command: &[String],
) -> Result<ExitCode, LockError> {
    let guard = locker.acquire(name).await?;
    let fence = guard.fencing_token();
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("DISTLOCK_LOCK", name)
        .env("DISTLOCK_FENCE", fence.to_string())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| LockError::config_caused_by(format!("cannot start {:?}", command[0]), e))?;
    tokio::select! {
        status = child.wait() => {
            let lost = guard.loss_reason();
            let released = guard.release().await?;
            let status = status.map_err(|e| LockError::config_caused_by("waiting for the command", e))?;
            if lost.is_some() || released == distlock::ReleaseOutcome::NotHeld {
                eprintln!("distlock: the lease on {name} was lost before the command finished");
                return Ok(ExitCode::from(LOST));
            }
            Ok(ExitCode::from(status.code().map_or(1, |c| c.clamp(0, 255) as u8)))
        }
        reason = guard.lost() => {
            let _ = child.kill().await;
            Err(LockError::Lost { name: guard.name(), fence, reason })
        }
    }
}
