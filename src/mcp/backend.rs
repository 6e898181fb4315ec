//! Where a tool call goes: the [`Backend`] trait and the arguments it takes.
//!
//! A backend answers with the cell result as JSON (the contract of `docs/contract.md`), so
//! one renderer (`render.rs`) serves the local orchestrator, a remote server and the server's
//! own `/v1/mcp` alike.

use async_trait::async_trait;
use rmcp::model::Extensions;
use schemars::JsonSchema;
use serde::Deserialize;

/// The arguments of `execute_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteCode {
    /// The Python source to run, as in a notebook cell (the value of a last expression is shown).
    pub code: String,
    /// Discard this session's kernel (all its state) first and run in a fresh one.
    #[serde(default)]
    pub reset: bool,
    #[schemars(
        description = "Seconds the cell may run (default: the server's, 30 s unless \
        configured). Past it the kernel is killed and all state is lost."
    )]
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// Why a tool call produced no cell result; the text goes to the model as an error result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Refusal(pub String);

/// Runs cells for one MCP connection.
#[async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// Runs `args` for the caller described by `request` (the HTTP request's parts on
    /// `/v1/mcp`, nothing on stdio) and returns the cell result as JSON.
    async fn execute(
        &self,
        request: &Extensions,
        args: ExecuteCode,
    ) -> Result<serde_json::Value, Refusal>;

    /// Disposes of the connection's kernels when it ends (stdio); a no-op by default.
    async fn close(&self) {}
}
