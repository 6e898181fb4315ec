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
    let (format, levels) = args.logging();
    if let Err(e) = kernelbox::logging::init(format, levels, args.is_server()) {
        let _ = writeln!(std::io::stderr(), "kernelbox: {e}");
        return ExitCode::from(2);
    }
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
            kernelbox::logging::say_at(tracing::Level::ERROR, &format!("kernelbox: {e:#}"));
            ExitCode::from(cli::exit_code_for(&e))
        }
    }
}
