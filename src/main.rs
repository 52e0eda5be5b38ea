//! `distlock`: take, inspect and break locks from the shell.
//!
//! ```text
//! distlock run nightly-settlement -- ./settle.sh            # the lock file of this host
//! distlock --url redis://127.0.0.1:6379 run nightly -- ./settle.sh
//! distlock inspect --json nightly-settlement
//! ```

mod cli;

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DISTLOCK_LOG"))
        .with_writer(std::io::stderr)
        .init();
    cli::main().await
}
