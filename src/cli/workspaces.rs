//! `kernelbox workspaces`: a tenant's workspaces on a server (docs/workspaces.md): list them,
//! delete one. Their files go in and out with `kernelbox cp` through the session.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use kernelbox::client::Client;

#[derive(Debug, Args)]
pub(crate) struct WorkspacesArgs {
    /// The kernelbox server's base URL.
    #[arg(long, env = "KERNELBOX_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The tenant's bearer token.
    #[arg(long, env = "KERNELBOX_TOKEN", hide_env_values = true)]
    token: String,
    /// Print JSON (with `list`).
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    verb: Option<Verb>,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// The tenant's workspaces: name, size, quota, last use, in use (the default).
    List,
    /// Deletes a workspace no kernel uses (clear its session first).
    Rm {
        /// The workspace's name (its session).
        name: String,
    },
}

pub(crate) async fn workspaces(args: WorkspacesArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&args.url, Some(args.token));
    match args.verb.unwrap_or(Verb::List) {
        Verb::List => {
            let list = client.workspaces().await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<32} {:>12} {:>12} {:<20} IN_USE",
                "NAME", "SIZE", "QUOTA", "LAST_USED"
            );
            for w in list {
                let last = humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(w.last_used),
                );
                println!(
                    "{:<32} {:>12} {:>12} {:<20} {}",
                    w.name, w.size_bytes, w.quota_bytes, last, w.in_use
                );
            }
        }
        Verb::Rm { name } => {
            client.delete_workspace(&name).await?;
            println!("deleted {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
