//! The local backend: `kernelbox mcp` running its own kernels through an [`Orchestrator`], as
//! `exec` and `repl` do, for one session.

use async_trait::async_trait;
use rmcp::model::Extensions;

use super::backend::{Backend, ExecuteCode, FileHead, Refusal};
use super::files;
use crate::cell::CellResult;
use crate::files::{FilePath, Listing, Written};
use crate::orchestrator::{CommandRequest, ExecuteRequest, FileRequest, Orchestrator, Scope};
use crate::wire::{CommandBody, CommandResult};

/// One session's cells on a local orchestrator.
pub(crate) struct LocalBackend {
    pub orchestrator: Orchestrator,
    pub session: String,
}

impl LocalBackend {
    /// The file request for this session's kernel, or its delegated `child`'s.
    fn file_request(&self, child: Option<&str>) -> FileRequest {
        FileRequest::new(Scope {
            child: child.map(str::to_owned),
            ..Scope::session(self.session.clone())
        })
    }
}

#[async_trait]
impl Backend for LocalBackend {
    async fn execute(
        &self,
        _request: &Extensions,
        args: ExecuteCode,
    ) -> Result<CellResult, Refusal> {
        let config = self.orchestrator.config();
        let timeout = args
            .timeout
            .map(|secs| config.cell_timeout_from_secs(secs))
            .transpose()
            .map_err(|e| Refusal(e.to_string()))?;
        let request = ExecuteRequest {
            scope: Scope {
                child: args.child,
                ..Scope::session(self.session.clone()).language(args.language.unwrap_or_default())
            },
            code: args.code,
            reset: args.reset,
            timeout,
            ..ExecuteRequest::default()
        };
        self.orchestrator
            .execute(request)
            .await
            .map_err(|e| Refusal(format!("kernelbox could not run the cell: {e}")))
    }

    async fn run_command(
        &self,
        _request: &Extensions,
        body: CommandBody,
    ) -> Result<CommandResult, Refusal> {
        let scope = Scope::session(self.session.clone());
        let request = CommandRequest::from_body(scope, body, self.orchestrator.config())
            .map_err(|e| Refusal(format!("kernelbox: {e}")))?;
        self.orchestrator
            .run_command(request)
            .await
            .map_err(|e| Refusal(format!("kernelbox could not run the command: {e}")))
    }

    async fn write_file(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        content: Vec<u8>,
    ) -> Result<Written, Refusal> {
        let request = self.file_request(child);
        files::write(&self.orchestrator, &request, path, content).await
    }

    async fn read_file(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        max: usize,
    ) -> Result<FileHead, Refusal> {
        let request = self.file_request(child);
        files::read(&self.orchestrator, &request, path, max).await
    }

    async fn list_files(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
    ) -> Result<Listing, Refusal> {
        let request = self.file_request(child);
        files::list(&self.orchestrator, &request, path).await
    }

    async fn close(&self) {
        self.orchestrator.clear_session(None, &self.session).await;
    }
}
