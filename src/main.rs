//! The `kernelbox` binary: a thin clap front over the library.
//!
//! Exit codes (`docs/cli.md`): 0 success; 1 the cell did not succeed (`exec`); 2 bad usage or
//! configuration (a server's 4xx); 3 the Docker engine (with `--url`, the server) is
//! unreachable or its answer broke off; 4 the kernel image is missing; 5 any other failure.

mod cli;

/// Lets a verb piped into `head` end quietly instead of panicking on a broken pipe, as
/// command-line tools do. Not for `serve`, whose sockets must never kill the process.
#[allow(unsafe_code)]
fn restore_sigpipe() {
    // SAFETY: called once at start, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    if !args.is_server() {
        restore_sigpipe();
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KERNELBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // A failed log write is dropped: reporting it uses `eprintln!`, which panics when
        // stderr is gone (a supervisor that closed the log pipe), mid-shutdown or mid-cleanup.
        .log_internal_errors(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "kernelbox: cannot start the async runtime: {e}"
            );
            return ExitCode::from(5);
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            // Not `eprintln!`: it panics when stderr is gone, losing the documented exit code.
            let _ = writeln!(std::io::stderr(), "kernelbox: {e:#}");
            ExitCode::from(cli::exit_code_for(&e))
        }
    }
}
