//! The Rust client of the HTTP API (`docs/http-api.md`, `docs/files.md`): `kernelbox exec
//! --url`, `kernelbox sh --url`, `kernelbox cp` and `kernelbox mcp --url` call a server through it. It keeps no
//! rule of its own about names, timeouts or paths: the server judges them, and the client
//! hands back the server's status and message.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Client`]: a server's base URL and bearer token; one request sent and its answer read (JSON, bounded); execute, a shell command, a session's network policy, clearing a session |
//! | `files.rs` | the file API: an upload streamed or in one piece ([`Content`]), a download streamed ([`Fetched`]) or a listing |
//! | `error.rs` | [`ClientError`]: which step of a call failed; the one reader of the server's error JSON; [`within`], a call under a deadline |
//!
//! URLs come from [`crate::wire::path`], which percent-encodes every name and path; the
//! bodies are the wire types ([`ExecuteBody`](crate::wire::ExecuteBody),
//! [`CommandBody`](crate::wire::CommandBody)) and the server's own result types
//! ([`CellResult`], [`CommandResult`](crate::wire::CommandResult), [`Written`](crate::files::Written),
//! [`Listing`](crate::files::Listing)).

mod error;
mod files;

pub use error::{within, ClientError};
pub use files::{Content, Download, Fetched, FileTarget};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

use crate::cell::CellResult;
use crate::wire::{path, CommandBody, CommandResult, ExecuteBody, NetworkPolicy};

/// Largest JSON answer read from a server (a cell result with its rich results, a listing,
/// an error).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// A request's body: streamed (an upload) or in one piece (JSON, or nothing).
type RequestBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// A kernelbox server, reached over HTTP/1.1 with a tenant's bearer token.
#[derive(Debug, Clone)]
pub struct Client {
    /// `http://host:port`, without a trailing `/`.
    base: String,
    token: Option<String>,
    http: hyper_util::client::legacy::Client<HttpConnector, RequestBody>,
}

impl Client {
    /// A client of the server at `url` (e.g. `http://127.0.0.1:8080`), sending `token` as
    /// `Authorization: Bearer` when there is one.
    pub fn new(url: &str, token: Option<String>) -> Client {
        Client {
            base: url.trim_end_matches('/').to_string(),
            token,
            http: hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// `POST /v1/sessions/{session}/execute`: runs one cell and returns its result.
    pub async fn execute(
        &self,
        session: &str,
        body: &ExecuteBody,
    ) -> Result<CellResult, ClientError> {
        let json = serde_json::to_vec(body).map_err(ClientError::Encode)?;
        let body = Some(("application/json", one_piece(Bytes::from(json))));
        let response = self
            .send(
                Method::POST,
                &path::execute(session),
                "application/json",
                body,
            )
            .await?;
        json_answer(response, "a cell result").await
    }

    /// `PUT /v1/sessions/{session}/network`: sets the session's network policy (intersected
    /// with its tenant's, applied at once); returns how many of its connections the new
    /// policy closed.
    pub async fn set_network(
        &self,
        session: &str,
        policy: &NetworkPolicy,
    ) -> Result<u64, ClientError> {
        #[derive(serde::Deserialize)]
        struct Applied {
            closed: u64,
        }
        let json = serde_json::to_vec(policy).map_err(ClientError::Encode)?;
        let body = Some(("application/json", one_piece(Bytes::from(json))));
        let response = self
            .send(
                Method::PUT,
                &path::network(session),
                "application/json",
                body,
            )
            .await?;
        json_answer::<Applied>(response, "the network policy applied")
            .await
            .map(|a| a.closed)
    }

    /// `POST /v1/sessions/{session}/commands`: runs one shell command in the session's kernel
    /// container (`docs/http-api.md`, "Commands") and returns what it did.
    pub async fn run_command(
        &self,
        session: &str,
        body: &CommandBody,
    ) -> Result<CommandResult, ClientError> {
        let json = serde_json::to_vec(body).map_err(ClientError::Encode)?;
        let body = Some(("application/json", one_piece(Bytes::from(json))));
        let response = self
            .send(
                Method::POST,
                &path::commands(session),
                "application/json",
                body,
            )
            .await?;
        json_answer(response, "a command result").await
    }

    /// `DELETE /v1/sessions/{session}`: disposes of the session's kernels.
    pub async fn clear_session(&self, session: &str) -> Result<(), ClientError> {
        let response = self
            .send(
                Method::DELETE,
                &path::session(session),
                "application/json",
                None,
            )
            .await?;
        json_answer::<serde_json::Value>(response, "a count")
            .await
            .map(drop)
    }

    /// `GET /v1/usage` (docs/usage.md): the caller's tenant's usage ledger (every tenant's for
    /// a usage admin).
    pub async fn usage(
        &self,
        query: &crate::wire::UsageQuery,
    ) -> Result<crate::wire::UsageReport, ClientError> {
        let response = self
            .send(Method::GET, &path::usage(query), "application/json", None)
            .await?;
        json_answer(response, "the usage ledger").await
    }

    /// `GET /v1/workspaces` (docs/workspaces.md): the tenant's workspaces.
    pub async fn workspaces(&self) -> Result<Vec<crate::workspace::WorkspaceSummary>, ClientError> {
        #[derive(serde::Deserialize)]
        struct Answer {
            workspaces: Vec<crate::workspace::WorkspaceSummary>,
        }
        let response = self
            .send(Method::GET, path::WORKSPACES, "application/json", None)
            .await?;
        let answer: Answer = json_answer(response, "the workspaces").await?;
        Ok(answer.workspaces)
    }

    /// `DELETE /v1/workspaces/{name}`: deletes a workspace no kernel uses.
    pub async fn delete_workspace(&self, name: &str) -> Result<(), ClientError> {
        let response = self
            .send(
                Method::DELETE,
                &path::workspace(name),
                "application/json",
                None,
            )
            .await?;
        json_answer::<serde_json::Value>(response, "the deletion")
            .await
            .map(drop)
    }

    /// `PUT /v1/sessions/{session}/settings`: replaces the session's settings.
    pub async fn set_settings(
        &self,
        session: &str,
        settings: &crate::wire::SessionSettings,
    ) -> Result<crate::wire::SettingsApplied, ClientError> {
        let json = serde_json::to_vec(settings).map_err(ClientError::Encode)?;
        let body = Some(("application/json", one_piece(Bytes::from(json))));
        let response = self
            .send(
                Method::PUT,
                &path::settings(session),
                "application/json",
                body,
            )
            .await?;
        json_answer(response, "the settings").await
    }

    /// `GET /v1/nodes` (the token must be the cluster's admin token): the cluster's nodes,
    /// as the server answers them (docs/cluster.md, "Admin").
    pub async fn nodes(&self) -> Result<serde_json::Value, ClientError> {
        let response = self
            .send(Method::GET, path::NODES, "application/json", None)
            .await?;
        json_answer(response, "the cluster's nodes").await
    }

    /// `GET /v1/nodes/{node}/kernels` (the admin token): one node's kernels, every tenant's.
    pub async fn node_kernels(&self, node: &str) -> Result<serde_json::Value, ClientError> {
        let response = self
            .send(
                Method::GET,
                &path::node_kernels(node),
                "application/json",
                None,
            )
            .await?;
        json_answer(response, "a node's kernels").await
    }

    /// `POST` (or, with `draining` false, `DELETE`) `/v1/nodes/{node}/drain`.
    pub async fn drain(&self, node: &str, draining: bool) -> Result<(), ClientError> {
        let method = if draining {
            Method::POST
        } else {
            Method::DELETE
        };
        let response = self
            .send(method, &path::drain(node), "application/json", None)
            .await?;
        json_answer::<serde_json::Value>(response, "the drain")
            .await
            .map(drop)
    }

    /// Sends one request to `path` (below the base URL) with `body` of its content type, and
    /// returns the answer's head once it arrives.
    async fn send(
        &self,
        method: Method,
        path: &str,
        accept: &'static str,
        body: Option<(&'static str, RequestBody)>,
    ) -> Result<Response<Incoming>, ClientError> {
        let uri = format!("{}{path}", self.base);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(&uri)
            .header(ACCEPT, accept);
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            Some((content_type, body)) => {
                request = request.header(CONTENT_TYPE, content_type);
                body
            }
            None => Empty::new().map_err(|e| match e {}).boxed_unsync(),
        };
        let request = request
            .body(body)
            .map_err(|e| ClientError::BadUrl { uri, error: e })?;
        self.http
            .request(request)
            .await
            .map_err(|e| ClientError::Unreachable {
                base: self.base.clone(),
                error: e,
            })
    }
}

/// A body sent in one piece (its length known, so it goes with a `Content-Length`).
fn one_piece(bytes: Bytes) -> RequestBody {
    Full::new(bytes).map_err(|e| match e {}).boxed_unsync()
}

/// An answer's body, read whole (at most [`MAX_ANSWER_BYTES`]).
async fn read_answer(response: Response<Incoming>) -> Result<Bytes, ClientError> {
    Ok(Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(ClientError::Read)?
        .to_bytes())
}

/// A JSON answer read as `T` (`what` names it for a message), or the server's refusal.
async fn json_answer<T: DeserializeOwned>(
    response: Response<Incoming>,
    what: &'static str,
) -> Result<T, ClientError> {
    let status = response.status();
    let bytes = read_answer(response).await?;
    if !status.is_success() {
        return Err(ClientError::refused(status, &bytes));
    }
    serde_json::from_slice(&bytes).map_err(|e| ClientError::decode(status, what, e))
}

#[cfg(test)]
mod tests;
