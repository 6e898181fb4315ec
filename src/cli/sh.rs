//! `kernelbox sh SESSION -- cmd...`: one shell command in a session's kernel container, on a
//! server (`--url`, through `src/client/`) or in a kernel of its own (like `exec`); its stdout
//! and stderr go to ours, and its exit code is ours (`docs/cli.md`, exit codes).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use kernelbox::client::Client;
use kernelbox::wire::{CommandBody, CommandLine, CommandResult};
use kernelbox::{CommandRequest, Scope};

use super::{parse_label, KernelOpts};

/// Our exit code when the command ran past its timeout (as `timeout(1)`'s).
const TIMED_OUT: u8 = 124;
/// Our exit code when the command's own is unknown or outside 0-255.
const NO_EXIT_CODE: u8 = 125;

#[derive(Debug, Args)]
pub(crate) struct ShArgs {
    /// Session (conversation) whose kernel container runs the command.
    session: String,
    /// Run on a kernelbox server at this URL instead of a local kernel.
    #[arg(long, env = "KERNELBOX_URL")]
    url: Option<String>,
    /// Bearer token for --url.
    #[arg(long, env = "KERNELBOX_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Working directory, relative to the kernel's (/work) or absolute.
    #[arg(long)]
    cwd: Option<String>,
    /// Environment variable KEY=VALUE added to the kernel's (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_label)]
    env: Vec<(String, String)>,
    /// Give this process's standard input to the command (read whole first).
    #[arg(short = 'i', long = "stdin")]
    stdin: bool,
    #[command(flatten)]
    kernel: KernelOpts,
    /// The program and its arguments, after `--` (run as given; `-- sh -c '...'` for a
    /// shell line).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs the command, prints its output, and exits with its exit code.
pub(crate) async fn run(args: ShArgs) -> anyhow::Result<ExitCode> {
    let stdin = if args.stdin {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the command's stdin")?;
        Some(text)
    } else {
        None
    };
    let body = CommandBody {
        command: CommandLine::Argv(args.command.clone()),
        cwd: args.cwd.clone(),
        env: args.env.iter().cloned().collect::<BTreeMap<_, _>>(),
        stdin,
        timeout: Some(args.kernel.timeout.as_secs_f64().into()),
    };
    let result = match &args.url {
        Some(url) => {
            Client::new(url, args.token.clone())
                .run_command(&args.session, &body)
                .await?
        }
        None => local(&args, body).await?,
    };
    print(&result)?;
    Ok(ExitCode::from(exit_code(&result)))
}

/// The command in a kernel of this process's own orchestrator, gone when it ends.
async fn local(args: &ShArgs, body: CommandBody) -> anyhow::Result<CommandResult> {
    let orchestrator = super::start(&args.kernel).await?;
    let ran = async {
        let request = CommandRequest::from_body(
            Scope::session(args.session.clone()),
            body,
            orchestrator.config(),
        )?;
        // Ctrl-C ends the run: the orchestrator's shutdown below removes the kernel and the
        // command with it.
        tokio::select! {
            result = orchestrator.run_command(request) => Ok(result?),
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    }
    .await;
    orchestrator.shutdown().await;
    ran
}

/// The command's stdout on ours, its stderr on ours, and kernelbox's notes (a timeout, a cut
/// stream) after them on stderr.
fn print(result: &CommandResult) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(result.stdout.as_bytes())?;
    out.flush()?;
    let mut err = std::io::stderr().lock();
    err.write_all(result.stderr.as_bytes())?;
    for (name, cut, total) in [
        ("stdout", result.stdout_truncated, result.stdout_bytes_total),
        ("stderr", result.stderr_truncated, result.stderr_bytes_total),
    ] {
        if cut == Some(true) {
            let total = total.map(|t| format!(" of {t} bytes")).unwrap_or_default();
            writeln!(
                err,
                "kernelbox: the command's {name} was cut{total} (its start and end kept)"
            )?;
        }
    }
    if result.timed_out {
        writeln!(
            err,
            "kernelbox: the command timed out after {:.1} s and was killed",
            result.duration_seconds
        )?;
    }
    Ok(())
}

/// Our exit code for the command's result (`docs/cli.md`, exit codes).
fn exit_code(result: &CommandResult) -> u8 {
    if result.timed_out {
        return TIMED_OUT;
    }
    u8::try_from(result.exit_code).unwrap_or(NO_EXIT_CODE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_the_commands() {
        let ran = |exit_code, timed_out| CommandResult {
            exit_code,
            timed_out,
            ..CommandResult::default()
        };
        assert_eq!(exit_code(&ran(0, false)), 0);
        assert_eq!(exit_code(&ran(7, false)), 7);
        assert_eq!(exit_code(&ran(-1, true)), TIMED_OUT);
        assert_eq!(exit_code(&ran(-1, false)), NO_EXIT_CODE);
        assert_eq!(exit_code(&ran(300, false)), NO_EXIT_CODE);
    }
}
