//! The MCP server itself: the tools it lists and what each does, over any transport.
//!
//! Tool descriptions tell a model what persists and what a timeout does (docs/results.md, "The result
//! of a cell"; `docs/contract.md`).

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};

use super::backend::{Backend, ExecuteCode, ListFiles, ReadFile, Refusal, RunCommand, WriteFile};
use super::files::{content_of, render_listing, render_read, MAX_READ_BYTES};
use super::render::{render, render_command};
use crate::files::FilePath;

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

/// What `run_command` does, for the model.
pub(crate) const COMMAND_DESCRIPTION: &str = "Run a shell command in this conversation's \
sandbox: the same container, working directory (/work) and files as execute_code's Python \
kernel, with no network access. `command` is a list of arguments run as given \
([\"ls\", \"-l\"]) or one string run by /bin/sh -c (\"grep -r TODO . | wc -l\"). Returns the \
exit code, then stdout and stderr separately; the result is an error when the exit code is not \
0. `timeout` is in seconds (default 30): past it the command and every process it started are \
killed, while the Python kernel and its variables are kept. `cwd`, `env` and `stdin` are \
optional. Starts the kernel if none is running.";

/// What `write_file` does, for the model.
pub(crate) const WRITE_DESCRIPTION: &str = "Write a file into the working directory of this \
conversation's Python kernel (the directory execute_code runs in), so code can open it by the \
same relative path. Give the content as `content` (text) or `content_base64` (binary). Parent \
directories are created; an existing file is replaced. Starts the kernel if none is running. \
Files live and die with the kernel: a timeout, `reset: true` or the session ending loses them. \
Paths are relative; `..` and absolute paths are refused.";

/// What `read_file` does, for the model.
pub(crate) const READ_DESCRIPTION: &str = "Read a file from the working directory of this \
conversation's Python kernel (e.g. one your code wrote). Text comes back as text, a PNG or JPEG \
as an image, other bytes as base64; only the first 256 KiB is returned, with a note when the file \
is longer. Files live and die with the kernel: there is nothing to read when no kernel is \
running. Paths are relative to the working directory.";

/// What `list_files` does, for the model.
pub(crate) const LIST_DESCRIPTION: &str = "List a directory of the working directory of this \
conversation's Python kernel (default: the working directory itself): name, kind, size and \
modification time of each entry. Files live and die with the kernel: there is nothing to list \
when no kernel is running.";

/// What the server tells a client about itself.
const INSTRUCTIONS: &str = "kernelbox: a persistent, sandboxed Python kernel for this \
conversation. Use execute_code to run Python; state carries over between calls. run_command \
runs a shell command beside the kernel, in the same files. write_file, \
read_file and list_files move files in and out of the kernel's working directory.";

fn refused(refusal: Refusal) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(refusal.0)])
}

/// A tool's `path` argument, checked once here (`FilePath::parse`) and passed on typed.
fn file_path(path: &str) -> Result<FilePath, CallToolResult> {
    FilePath::parse(path).map_err(|e| refused(Refusal(format!("kernelbox: {e}"))))
}

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
            Err(refusal) => refused(refusal),
        })
    }

    #[tool(name = "run_command", description = COMMAND_DESCRIPTION)]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunCommand>,
        request: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self.backend.run_command(&request, args.into_body()).await {
                Ok(result) => render_command(&result),
                Err(refusal) => refused(refusal),
            },
        )
    }

    #[tool(name = "write_file", description = WRITE_DESCRIPTION)]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFile>,
        request: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let content = match content_of(args.content, args.content_base64) {
            Ok(content) => content,
            Err(refusal) => return Ok(refused(refusal)),
        };
        let path = match file_path(&args.path) {
            Ok(path) => path,
            Err(refusal) => return Ok(refusal),
        };
        Ok(
            match self
                .backend
                .write_file(&request, args.child.as_deref(), &path, content)
                .await
            {
                Ok(written) => CallToolResult::success(vec![ContentBlock::text(format!(
                    "wrote {} bytes to {}",
                    written.size, written.path
                ))]),
                Err(refusal) => refused(refusal),
            },
        )
    }

    #[tool(name = "read_file", description = READ_DESCRIPTION)]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFile>,
        request: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let path = match file_path(&args.path) {
            Ok(path) => path,
            Err(refusal) => return Ok(refusal),
        };
        Ok(
            match self
                .backend
                .read_file(&request, args.child.as_deref(), &path, MAX_READ_BYTES)
                .await
            {
                Ok(head) => render_read(&args.path, &head),
                Err(refusal) => refused(refusal),
            },
        )
    }

    #[tool(name = "list_files", description = LIST_DESCRIPTION)]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFiles>,
        request: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let path = match file_path(args.path.as_deref().unwrap_or_default()) {
            Ok(path) => path,
            Err(refusal) => return Ok(refusal),
        };
        Ok(
            match self
                .backend
                .list_files(&request, args.child.as_deref(), &path)
                .await
            {
                Ok(listing) => render_listing(path.as_str(), &listing),
                Err(refusal) => refused(refusal),
            },
        )
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
