//! The backend of `/v1/mcp`'s tool calls: the server's own execute and command paths and the
//! orchestrator's file calls, for the caller's tenant and session (see `mcp_session.rs` for how a session is named).

use std::sync::Arc;

use async_trait::async_trait;
use axum::http::request::Parts;
use rmcp::model::Extensions;

use super::mcp_session::session_of;
use super::{file_request, run_cell, run_command};
use crate::cell::CellResult;
use crate::files::{FilePath, Listing, Written};
use crate::mcp::{files, Backend, ExecuteCode, FileHead, Refusal};
use crate::orchestrator::FileRequest;
use crate::server::{AppState, Tenant};
use crate::wire::{CommandBody, CommandResult};

/// Tool calls on `/v1/mcp`: the server's own execute path, for the caller's tenant.
pub(super) struct HttpBackend {
    pub(super) state: AppState,
}

#[async_trait]
impl Backend for HttpBackend {
    async fn execute(
        &self,
        request: &Extensions,
        args: ExecuteCode,
    ) -> Result<CellResult, Refusal> {
        let parts = request
            .get::<Parts>()
            .ok_or_else(|| Refusal("kernelbox: the MCP request carried no HTTP request".into()))?;
        let tenant = parts
            .extensions
            .get::<Arc<Tenant>>()
            .ok_or_else(|| Refusal("kernelbox: the MCP request was not authenticated".into()))?;
        let session = session_of(parts)?;
        run_cell(&self.state, tenant, session, args.into_body())
            .await
            .map_err(|e| refusal("cell", e))
    }

    async fn run_command(
        &self,
        request: &Extensions,
        body: CommandBody,
    ) -> Result<CommandResult, Refusal> {
        let parts = request
            .get::<Parts>()
            .ok_or_else(|| Refusal("kernelbox: the MCP request carried no HTTP request".into()))?;
        let tenant = parts
            .extensions
            .get::<Arc<Tenant>>()
            .ok_or_else(|| Refusal("kernelbox: the MCP request was not authenticated".into()))?;
        let session = session_of(parts)?;
        run_command(&self.state, tenant, session, body)
            .await
            .map_err(|e| refusal("command", e))
    }

    async fn write_file(
        &self,
        request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        content: Vec<u8>,
    ) -> Result<Written, Refusal> {
        let request = self.file_request(request, child)?;
        files::write(self.state.orchestrator(), &request, path, content).await
    }

    async fn read_file(
        &self,
        request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        max: usize,
    ) -> Result<FileHead, Refusal> {
        let request = self.file_request(request, child)?;
        files::read(self.state.orchestrator(), &request, path, max).await
    }

    async fn list_files(
        &self,
        request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
    ) -> Result<Listing, Refusal> {
        let request = self.file_request(request, child)?;
        files::list(self.state.orchestrator(), &request, path).await
    }
}

/// The server's refusal of the `what` (`cell`, `command`) as the model reads it.
fn refusal(what: &str, e: crate::server::ApiError) -> Refusal {
    let retry = e
        .retry_after
        .map(|s| format!(" (retry after {s} s)"))
        .unwrap_or_default();
    Refusal(format!(
        "kernelbox refused the {what} ({}): {}{retry}",
        e.code, e.message
    ))
}

impl HttpBackend {
    /// The caller's tenant and session (or the session's delegated `child`) of a `/v1/mcp`
    /// tool call, as the HTTP file API has them.
    fn file_request(
        &self,
        request: &Extensions,
        child: Option<&str>,
    ) -> Result<FileRequest, Refusal> {
        let parts = request
            .get::<Parts>()
            .ok_or_else(|| Refusal("kernelbox: the MCP request carried no HTTP request".into()))?;
        let tenant = parts
            .extensions
            .get::<Arc<Tenant>>()
            .ok_or_else(|| Refusal("kernelbox: the MCP request was not authenticated".into()))?;
        let session = session_of(parts)?;
        if self.state.is_draining() {
            return Err(Refusal("kernelbox: the server is shutting down".into()));
        }
        Ok(file_request(tenant, session, child.map(str::to_owned)))
    }
}
