//! `distlock`: take, inspect and break locks from the shell.
//!
//! ```text
//! distlock run nightly-settlement -- ./settle.sh            # the lock file of this host
//! distlock --url redis://127.0.0.1:6379 run nightly -- ./settle.sh
//! distlock inspect --json nightly-settlement
//! ```

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    // `run`'s supervisor is this binary again: one thread, no runtime.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = cli::supervisor_mode(&args) {
        return code;
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DISTLOCK_LOG"))
        .with_writer(std::io::stderr)
        .init();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(cli::main()),
        Err(e) => {
            eprintln!("distlock: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}
