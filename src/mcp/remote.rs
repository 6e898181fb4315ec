//! The remote backend: `kernelbox mcp --url` calling a kernelbox server's HTTP API through
//! the crate's client (`src/client/`: `POST /v1/sessions/{session}/execute`,
//! `/v1/sessions/{session}/commands`,
//! `/v1/sessions/{session}/files/{path}`, `DELETE /v1/sessions/{session}`) for one session.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use rmcp::model::Extensions;

use super::backend::{Backend, ExecuteCode, FileHead, Refusal};
use crate::cell::CellResult;
use crate::client::{within, Client, ClientError, Content, Download, Fetched, FileTarget};
use crate::files::{FilePath, Listing, Written};
use crate::wire::{CommandBody, CommandResult};

/// How long past the cell's (or command's) own timeout (the server's longest, 1 h, when none is given) a call
/// may wait for the server before it is abandoned.
const SLACK: Duration = Duration::from_secs(60);
const LONGEST_CELL: Duration = Duration::from_secs(3600);

/// How long a file call may take (an upload, or the first MiB of a read) before it is
/// abandoned.
const FILE_DEADLINE: Duration = Duration::from_secs(300);

/// How long clearing the session when the connection ends may take.
const CLOSE_DEADLINE: Duration = Duration::from_secs(30);

/// One session on a kernelbox server.
pub(crate) struct RemoteBackend {
    client: Client,
    session: String,
    /// Whether the session's kernels go when the connection ends (a session this connection
    /// made up, rather than one named with `--session`).
    dispose: bool,
}

impl RemoteBackend {
    pub(crate) fn new(
        url: &str,
        token: Option<String>,
        session: String,
        dispose: bool,
    ) -> RemoteBackend {
        RemoteBackend {
            client: Client::new(url, token),
            session,
            dispose,
        }
    }

    /// `path` in this session's kernel, or its `child`'s.
    fn target<'a>(&'a self, child: Option<&'a str>, path: &'a FilePath) -> FileTarget<'a> {
        FileTarget {
            session: &self.session,
            child,
            path: path.as_str(),
        }
    }
}

/// A failed call as the model reads it: the server's refusal of the `what` (`cell`, `file
/// call`) with its status and message, or what went wrong on the way.
fn refusal(what: &str, e: ClientError) -> Refusal {
    match e {
        ClientError::Refused { status, message } => Refusal(format!(
            "the kernelbox server refused the {what} ({status}): {message}"
        )),
        other => Refusal(format!("kernelbox: {other}")),
    }
}

/// How long a call that runs for at most `timeout` seconds (the server's longest when none is
/// given) may wait for the server: that, capped at [`LONGEST_CELL`], plus [`SLACK`].
fn deadline(timeout: Option<f64>) -> Duration {
    timeout
        .and_then(|t| Duration::try_from_secs_f64(t).ok())
        .unwrap_or(LONGEST_CELL)
        .min(LONGEST_CELL)
        + SLACK
}

/// The first `max` bytes of a download (the rest is dropped unread, which closes the
/// connection); `size` is the whole file's when the server gave it.
async fn head_of(
    size: Option<u64>,
    mut body: Download,
    max: usize,
) -> Result<FileHead, ClientError> {
    let mut bytes = Vec::new();
    while bytes.len() < max {
        match body.next().await {
            Some(chunk) => bytes.extend_from_slice(&chunk?),
            None => break,
        }
    }
    let read = bytes.len() as u64;
    bytes.truncate(max);
    Ok(FileHead {
        size: size.unwrap_or(read),
        bytes,
    })
}

#[async_trait]
impl Backend for RemoteBackend {
    async fn execute(
        &self,
        _request: &Extensions,
        args: ExecuteCode,
    ) -> Result<CellResult, Refusal> {
        let cell = deadline(args.timeout);
        let body = args.into_body();
        within(cell, self.client.execute(&self.session, &body))
            .await
            .map_err(|e| refusal("cell", e))
    }

    async fn run_command(
        &self,
        _request: &Extensions,
        body: CommandBody,
    ) -> Result<CommandResult, Refusal> {
        let seconds = body.timeout.as_ref().and_then(serde_json::Value::as_f64);
        within(
            deadline(seconds),
            self.client.run_command(&self.session, &body),
        )
        .await
        .map_err(|e| refusal("command", e))
    }

    async fn write_file(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        content: Vec<u8>,
    ) -> Result<Written, Refusal> {
        let target = self.target(child, path);
        let content = Content::Bytes(Bytes::from(content));
        within(FILE_DEADLINE, self.client.upload(&target, false, content))
            .await
            .map_err(|e| refusal("file call", e))
    }

    async fn read_file(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        max: usize,
    ) -> Result<FileHead, Refusal> {
        let target = self.target(child, path);
        let read = async {
            match self.client.download(&target, false).await? {
                Fetched::File { size, body } => head_of(size, body, max).await.map(Some),
                Fetched::Listing(_) | Fetched::Tar { .. } => Ok(None),
            }
        };
        within(FILE_DEADLINE, read)
            .await
            .map_err(|e| refusal("file call", e))?
            .ok_or_else(|| {
                Refusal(format!(
                    "kernelbox: {path} is a directory; use list_files to see what it holds"
                ))
            })
    }

    async fn list_files(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
    ) -> Result<Listing, Refusal> {
        let target = self.target(child, path);
        match within(FILE_DEADLINE, self.client.download(&target, false))
            .await
            .map_err(|e| refusal("file call", e))?
        {
            Fetched::Listing(listing) => Ok(listing),
            Fetched::File { .. } | Fetched::Tar { .. } => Err(Refusal(format!(
                "kernelbox: {path} is a file, not a directory; use read_file"
            ))),
        }
    }

    async fn close(&self) {
        if self.dispose {
            let _ = within(CLOSE_DEADLINE, self.client.clear_session(&self.session)).await;
        }
    }
}
