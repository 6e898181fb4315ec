//! `kernelbox audit verify FILE...`: checks an audit trail's hash chain (docs/usage.md, "Audit
//! trail"). Exit 0 when every line chains to the one before; 1 when the chain breaks (the
//! file and line are named); 2 when a file cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use kernelbox::audit::{verify, AuditError, GENESIS};

use super::Exit;

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Check the hash chain of an audit trail: FILES oldest first (`audit.log.2 audit.log.1
    /// audit.log`); exit 1 naming the first line that does not chain to the one before.
    Verify(VerifyArgs),
}

#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    /// The trail's files, oldest first.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub(crate) fn run(command: AuditCommand) -> anyhow::Result<ExitCode> {
    let AuditCommand::Verify(args) = command;
    match verify(&args.files) {
        Ok(v) => {
            let from = if v.first_prev == GENESIS {
                "the trail's start".to_string()
            } else {
                format!(
                    "a line before these files (prev {}): earlier lines are in older files or \
                     were rotated out",
                    v.first_prev
                )
            };
            println!(
                "intact: {} lines, chained from {from}; the last line hashes to {}",
                v.lines, v.last_hash
            );
            // Where the trail starts and ends: a verifier sees when it starts later than
            // expected (rotation deleted older files; docs/usage.md, "Audit trail").
            match (&v.first_time, &v.last_time) {
                (Some(first), Some(last)) => {
                    println!("first line: {first}; last line: {last}")
                }
                _ => println!("no lines"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ AuditError::Broken { .. }) => Err(Exit {
            code: 1,
            message: format!("broken: {e}"),
        }
        .into()),
        Err(e) => Err(Exit {
            code: 2,
            message: e.to_string(),
        }
        .into()),
    }
}
