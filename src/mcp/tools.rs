//! The MCP server itself: the tools it lists and what each does, over any transport.
//!
//! Tool descriptions tell a model what persists and what a timeout does (README, "The result
//! of a cell"; `docs/contract.md`).

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};

use super::backend::{Backend, ExecuteCode};
use super::render::render;

/// What `execute_code` does, for the model.
pub(crate) const EXECUTE_DESCRIPTION: &str = "Run Python code in this conversation's own \
stateful Python kernel, a sandboxed container with no network access. State persists between \
calls: variables, imports, functions and files written in the working directory are still there \
on the next call, until `reset: true`, a timeout, or the session ends. Returns what the code \
printed (stdout and stderr interleaved) and the value of its last expression as text, and every \
image it displayed (display(), a matplotlib figure) as an image. If the code raises, the result is an error carrying the \
traceback, and the kernel and its state are kept. `timeout` is in seconds (default 30): a cell \
still running then is stopped by killing the kernel, and ALL state is lost; the next call starts \
a fresh kernel. `reset: true` discards all state first. When a kernel was lost (timeout, out of \
memory, idle too long, a crash) the next result begins with a [kernelbox] line saying so.";

/// What the server tells a client about itself.
const INSTRUCTIONS: &str = "kernelbox: a persistent, sandboxed Python kernel for this \
conversation. Use execute_code to run Python; state carries over between calls.";

/// The MCP server of one connection (stdio) or of every request of `/v1/mcp` (HTTP).
#[derive(Clone)]
pub(crate) struct KernelTools {
    backend: Arc<dyn Backend>,
    tool_router: ToolRouter<Self>,
}

impl KernelTools {
    /// A server whose tools run on `backend`.
    pub(crate) fn new(backend: Arc<dyn Backend>) -> KernelTools {
        KernelTools {
            backend,
            tool_router: Self::tool_router(),
        }
    }
}

#[tool_router]
impl KernelTools {
    #[tool(name = "execute_code", description = EXECUTE_DESCRIPTION)]
    async fn execute_code(
        &self,
        Parameters(args): Parameters<ExecuteCode>,
        request: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(match self.backend.execute(&request, args).await {
            Ok(result) => render(&result),
            Err(refusal) => CallToolResult::error(vec![ContentBlock::text(refusal.0)]),
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for KernelTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("kernelbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
