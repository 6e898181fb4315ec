//! MCP (the Model Context Protocol): kernelbox as tools an agent calls, built on the official
//! Rust SDK (`rmcp`). `kernelbox mcp` serves one session over stdio, running its own kernels or
//! calling a kernelbox server; `kernelbox serve` also answers MCP over streamable HTTP at
//! `/v1/mcp` (docs/mcp.md, "MCP").
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the public front: [`StdioBackend`], [`serve_io`], [`serve_stdio`], [`McpError`] |
//! | `tools.rs` | the MCP server: the tools (`execute_code`, `run_command`, the file tools), their descriptions, the server's info |
//! | `backend.rs` | the [`Backend`](backend::Backend) trait a tool call goes through, and the tools' arguments |
//! | `render.rs` | a cell result (`CellResult`) or a command's (`CommandResult`) as an MCP tool result: text, images, `isError` |
//! | `files.rs` | the file tools' orchestrator calls (local and `/v1/mcp`), and a file or a listing as an MCP tool result |
//! | `local.rs` | backend: a local orchestrator, one session |
//! | `remote.rs` | backend: a kernelbox server's HTTP API through the crate's client (`src/client/`), one session |
//!
//! MCP over streamable HTTP (`/v1/mcp`) is an adapter of the HTTP server, in
//! `server/api/mcp.rs`: it serves these tools through the server's own execute and command
//! paths.

mod backend;
pub(crate) mod files;
mod local;
mod remote;
mod render;
mod tools;

use std::sync::Arc;

use rmcp::ServiceExt;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::orchestrator::Orchestrator;
pub(crate) use backend::{Backend, ExecuteCode, FileHead, Refusal};
pub(crate) use tools::KernelTools;

/// Where `kernelbox mcp`'s cells run.
#[derive(Debug)]
pub enum StdioBackend {
    /// On this host, through the given orchestrator, in one session's kernel.
    Local {
        /// Runs the kernels.
        orchestrator: Orchestrator,
        /// The kernelbox session every cell of the connection runs in.
        session: String,
    },
    /// On a kernelbox server, through its HTTP API.
    Remote {
        /// The server's base URL, e.g. `http://127.0.0.1:8080`.
        url: String,
        /// The tenant's bearer token.
        token: Option<String>,
        /// The kernelbox session every cell of the connection runs in.
        session: String,
        /// Clear the session's kernels on the server when the connection ends.
        dispose: bool,
    },
}

/// Why an MCP connection could not be served.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The client never completed the MCP handshake (or the connection closed first).
    #[error("starting the MCP connection: {0}")]
    Initialize(String),
    /// The task serving the connection failed.
    #[error("serving the MCP connection: {0}")]
    Serve(String),
}

/// Serves one MCP connection over `read`/`write` until the client closes it, then disposes of
/// the connection's session where [`StdioBackend`] says so.
pub async fn serve_io<R, W>(backend: StdioBackend, read: R, write: W) -> Result<(), McpError>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let backend: Arc<dyn Backend> = match backend {
        StdioBackend::Local {
            orchestrator,
            session,
        } => Arc::new(local::LocalBackend {
            orchestrator,
            session,
        }),
        StdioBackend::Remote {
            url,
            token,
            session,
            dispose,
        } => Arc::new(remote::RemoteBackend::new(&url, token, session, dispose)),
    };
    let served = async {
        let running = tools::KernelTools::new(backend.clone())
            .serve((read, write))
            .await
            .map_err(|e| McpError::Initialize(e.to_string()))?;
        running
            .waiting()
            .await
            .map_err(|e| McpError::Serve(e.to_string()))?;
        Ok(())
    }
    .await;
    backend.close().await;
    served
}

/// [`serve_io`] on the process's standard input and output (standard error stays free for
/// logs).
pub async fn serve_stdio(backend: StdioBackend) -> Result<(), McpError> {
    serve_io(backend, tokio::io::stdin(), tokio::io::stdout()).await
}
