//! `kernelbox mcp`: MCP over standard input/output, one session per connection.

use std::process::ExitCode;

use clap::Args;

use kernelbox::mcp::{serve_stdio, StdioBackend};

use super::KernelOpts;

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    /// Kernelbox session the connection's cells run in. Default: a new session for this
    /// connection, whose kernel goes when the connection ends.
    #[arg(long)]
    session: Option<String>,
    /// Run cells on a kernelbox server at this URL instead of local kernels.
    #[arg(long, env = "KERNELBOX_URL")]
    url: Option<String>,
    /// Bearer token for --url.
    #[arg(long, env = "KERNELBOX_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    kernel: KernelOpts,
}

/// Serves one MCP connection on stdio until the client closes it.
pub(crate) async fn run(args: McpArgs) -> anyhow::Result<ExitCode> {
    let dispose = args.session.is_none();
    let session = args
        .session
        .unwrap_or_else(|| format!("mcp-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]));
    if let Some(url) = args.url {
        serve_stdio(StdioBackend::Remote {
            url,
            token: args.token,
            session,
            dispose,
        })
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    let orchestrator = super::start(&args.kernel).await?;
    let served = serve_stdio(StdioBackend::Local {
        orchestrator: orchestrator.clone(),
        session,
    })
    .await;
    orchestrator.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}
