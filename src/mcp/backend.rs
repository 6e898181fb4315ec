//! Where a tool call goes: the [`Backend`] trait and the arguments it takes.
//!
//! A backend answers with the typed results of the HTTP API (a [`CellResult`], `docs/contract.md`;
//! [`Written`], [`Listing`]: `docs/files.md`), so one renderer (`render.rs`, `files.rs`)
//! serves the local orchestrator, a remote server and the server's own `/v1/mcp` alike.

use async_trait::async_trait;
use rmcp::model::Extensions;
use schemars::JsonSchema;
use serde::Deserialize;

use std::collections::BTreeMap;

use crate::cell::CellResult;
use crate::files::{FilePath, Listing, Written};
use crate::wire::{CommandBody, CommandLine, CommandResult, ExecuteBody};

/// The arguments of `execute_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteCode {
    /// The source to run, as in a notebook cell (in Python the value of a last expression is
    /// shown).
    pub code: String,
    /// The cell's language: `python` (default), `bash` (a stateful shell: the working
    /// directory, variables and functions persist), `javascript` or `typescript` (Node, as a
    /// REPL: top-level declarations persist, top-level await). Each language has its own
    /// kernel in the session.
    #[serde(default)]
    pub language: Option<crate::wire::Language>,
    /// Discard this session's kernel (all its state) first and run in a fresh one.
    #[serde(default)]
    pub reset: bool,
    #[schemars(
        description = "Seconds the cell may run (default: the server's, 30 s unless \
        configured). Past it the kernel is killed and all state is lost."
    )]
    #[serde(default)]
    pub timeout: Option<f64>,
    /// A delegated child (sub-agent) of this session: the cell runs in the child's own
    /// kernel instead of the session's (as `child` on the HTTP execute request).
    #[serde(default)]
    pub child: Option<String>,
}

impl ExecuteCode {
    /// The execute body these arguments make (`docs/http-api.md`, "Endpoints"): the same
    /// request on the server's own execute path (`/v1/mcp`) as sent to a server (`--url`).
    pub(crate) fn into_body(self) -> ExecuteBody {
        ExecuteBody {
            code: self.code,
            reset: self.reset,
            timeout: self.timeout.map(serde_json::Value::from),
            child: self.child,
            language: self.language,
            ..ExecuteBody::default()
        }
    }
}

/// The arguments of `run_command`: the HTTP command body (`docs/http-api.md`, "Commands"),
/// with the timeout as seconds.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunCommand {
    /// The command: an argument vector (`["ls", "-l"]`, run as given), or one string run by
    /// `/bin/sh -c` (`"ls -l | wc -l"`).
    pub command: CommandLine,
    /// Working directory, relative to the kernel's (`/work`) or absolute; default `/work`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment variables added to the kernel's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text given to the command on its standard input (then end of file).
    #[serde(default)]
    pub stdin: Option<String>,
    #[schemars(
        description = "Seconds the command may run (default: the server's cell timeout, 30 s \
        unless configured). Past it the command and every process it started are killed; the \
        Python kernel and its state are kept."
    )]
    #[serde(default)]
    pub timeout: Option<f64>,
}

impl RunCommand {
    /// The command body these arguments make: the same request on the server's own path
    /// (`/v1/mcp`), sent to a server (`--url`) or run by a local orchestrator.
    pub(crate) fn into_body(self) -> CommandBody {
        CommandBody {
            command: self.command,
            cwd: self.cwd,
            env: self.env,
            stdin: self.stdin,
            timeout: self.timeout.map(serde_json::Value::from),
        }
    }
}

/// The arguments of `write_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFile {
    /// Where, relative to the kernel's working directory (e.g. `data/input.csv`); parent
    /// directories are created.
    pub path: String,
    /// The file's content as text (UTF-8). Give this or `content_base64`.
    #[serde(default)]
    pub content: Option<String>,
    /// The file's content as base64, for binary files. Give this or `content`.
    #[serde(default)]
    pub content_base64: Option<String>,
    /// A delegated child (sub-agent) of this session: its kernel's files instead of the
    /// session's (as `?child=NAME` on the HTTP file API).
    #[serde(default)]
    pub child: Option<String>,
}

/// The arguments of `read_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFile {
    /// The file, relative to the kernel's working directory.
    pub path: String,
    /// A delegated child (sub-agent) of this session: its kernel's files instead of the
    /// session's (as `?child=NAME` on the HTTP file API).
    #[serde(default)]
    pub child: Option<String>,
}

/// The arguments of `list_files`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListFiles {
    /// The directory, relative to the kernel's working directory (default: the working
    /// directory itself).
    #[serde(default)]
    pub path: Option<String>,
    /// A delegated child (sub-agent) of this session: its kernel's files instead of the
    /// session's (as `?child=NAME` on the HTTP file API).
    #[serde(default)]
    pub child: Option<String>,
}

/// The start of a file read for a model: at most the bound asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileHead {
    /// The file's whole size.
    pub size: u64,
    /// Its first bytes, at most the bound.
    pub bytes: Vec<u8>,
}

/// Why a tool call produced no cell result; the text goes to the model as an error result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Refusal(pub String);

/// Runs cells for one MCP connection.
#[async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// Runs `args` for the caller described by `request` (the HTTP request's parts on
    /// `/v1/mcp`, nothing on stdio) and returns the cell result.
    async fn execute(&self, request: &Extensions, args: ExecuteCode)
        -> Result<CellResult, Refusal>;

    /// Runs a shell command in the session's kernel container (starting the kernel when it
    /// has none) and returns what it did.
    async fn run_command(
        &self,
        request: &Extensions,
        body: CommandBody,
    ) -> Result<CommandResult, Refusal>;

    /// Writes `content` to `path` in the session's kernel, or its delegated `child`'s
    /// (starting it when it has none); returns what was written.
    async fn write_file(
        &self,
        request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        content: Vec<u8>,
    ) -> Result<Written, Refusal>;

    /// Reads at most `max` bytes of the file at `path` in the live kernel of the session, or
    /// of its delegated `child`.
    async fn read_file(
        &self,
        request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        max: usize,
    ) -> Result<FileHead, Refusal>;

    /// Lists the directory at `path` (`""`: the working directory) of the live kernel of the
    /// session, or of its delegated `child`.
    async fn list_files(
        &self,
        request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
    ) -> Result<Listing, Refusal>;

    /// Disposes of the connection's kernels when it ends (stdio); a no-op by default.
    async fn close(&self) {}
}
