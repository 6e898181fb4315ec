//! The remote backend: `kernelbox mcp --url` calling a kernelbox server's HTTP API
//! (`POST /v1/sessions/{session}/execute`, `/v1/sessions/{session}/files/{path}`,
//! `DELETE /v1/sessions/{session}`) for one session.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rmcp::model::Extensions;
use serde_json::Value;

use super::backend::{Backend, ExecuteCode, FileHead, Refusal};
use crate::cell::CellResult;
use crate::files::{FilePath, Listing, Written};

/// Largest response read from the server (a cell result with its rich results).
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// How long past the cell's own timeout (the server's longest, 1 h, when none is given) a call
/// may wait for the server before it is abandoned.
const SLACK: Duration = Duration::from_secs(60);
const LONGEST_CELL: Duration = Duration::from_secs(3600);

/// How long a file call may take (an upload, or the first MiB of a read) before it is
/// abandoned.
const FILE_DEADLINE: Duration = Duration::from_secs(300);

/// One session on a kernelbox server.
pub(crate) struct RemoteBackend {
    base: String,
    token: Option<String>,
    session: String,
    /// Whether the session's kernels go when the connection ends (a session this connection
    /// made up, rather than one named with `--session`).
    dispose: bool,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl RemoteBackend {
    pub(crate) fn new(
        url: &str,
        token: Option<String>,
        session: String,
        dispose: bool,
    ) -> RemoteBackend {
        RemoteBackend {
            base: url.trim_end_matches('/').to_string(),
            token,
            session,
            dispose,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Sends one request; `body` is JSON unless `content_type` says otherwise.
    async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, Refusal> {
        let uri = format!("{}{path}", self.base);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(&uri)
            .header(ACCEPT, "application/json");
        if let Some((content_type, _)) = &body {
            request = request.header(CONTENT_TYPE, *content_type);
        }
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = body.map(|(_, b)| b).unwrap_or_default();
        let request = request
            .body(Full::new(body))
            .map_err(|e| Refusal(format!("kernelbox: bad server URL {uri:?}: {e}")))?;
        self.client.request(request).await.map_err(|e| {
            Refusal(format!(
                "kernelbox: cannot reach the kernelbox server at {}: {e}",
                self.base
            ))
        })
    }

    /// [`send`](Self::send), then the answer read as JSON, all within `deadline`.
    async fn call_raw(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<(&'static str, Bytes)>,
        deadline: Duration,
    ) -> Result<(hyper::StatusCode, Bytes), Refusal> {
        let exchange = async {
            let response = self.send(method, path, body).await?;
            bytes_of(response).await
        };
        within(deadline, exchange).await?
    }

    /// The path of `file` in the file API of this session's kernel, or its `child`'s.
    fn file_path(&self, child: Option<&str>, file: &str) -> String {
        crate::wire::path::files(&self.session, file, child)
    }
}

async fn within<T>(
    deadline: Duration,
    work: impl std::future::Future<Output = T>,
) -> Result<T, Refusal> {
    tokio::time::timeout(deadline, work).await.map_err(|_| {
        Refusal(format!(
            "kernelbox: the server did not answer within {}",
            humantime::format_duration(deadline)
        ))
    })
}

/// A response's status and body (at most [`MAX_RESPONSE_BYTES`]).
async fn bytes_of(
    response: hyper::Response<hyper::body::Incoming>,
) -> Result<(hyper::StatusCode, Bytes), Refusal> {
    let status = response.status();
    let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| Refusal(format!("kernelbox: reading the server's answer: {e}")))?
        .to_bytes();
    Ok((status, bytes))
}

/// A JSON answer read as `T`.
fn json_of<T: serde::de::DeserializeOwned>(
    status: hyper::StatusCode,
    bytes: &[u8],
) -> Result<T, Refusal> {
    serde_json::from_slice(bytes).map_err(|_| {
        Refusal(format!(
            "kernelbox: the server answered {status} with something that is not JSON"
        ))
    })
}

/// The server's refusal of a file call, with its message.
fn file_refusal(status: hyper::StatusCode, value: &Value) -> Refusal {
    let message = value["error"]["message"]
        .as_str()
        .unwrap_or("request failed");
    Refusal(format!(
        "the kernelbox server refused the file call ({status}): {message}"
    ))
}

#[async_trait]
impl Backend for RemoteBackend {
    async fn execute(
        &self,
        _request: &Extensions,
        args: ExecuteCode,
    ) -> Result<CellResult, Refusal> {
        let cell = args
            .timeout
            .and_then(|t| Duration::try_from_secs_f64(t).ok())
            .unwrap_or(LONGEST_CELL)
            .min(LONGEST_CELL);
        let body = serde_json::to_vec(&args.into_body())
            .map_err(|e| Refusal(format!("kernelbox: {e}")))?;
        let path = crate::wire::path::execute(&self.session);
        let body = Some(("application/json", Bytes::from(body)));
        let (status, bytes) = self
            .call_raw(hyper::Method::POST, &path, body, cell + SLACK)
            .await?;
        if status.is_success() {
            json_of(status, &bytes)
        } else {
            let value: Value = json_of(status, &bytes)?;
            let message = value["error"]["message"]
                .as_str()
                .unwrap_or("request failed");
            Err(Refusal(format!(
                "the kernelbox server refused the cell ({status}): {message}"
            )))
        }
    }

    async fn write_file(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        content: Vec<u8>,
    ) -> Result<Written, Refusal> {
        let body = Some(("application/octet-stream", Bytes::from(content)));
        let (status, bytes) = self
            .call_raw(
                hyper::Method::PUT,
                &self.file_path(child, path.as_str()),
                body,
                FILE_DEADLINE,
            )
            .await?;
        if status.is_success() {
            json_of(status, &bytes)
        } else {
            Err(file_refusal(status, &json_of(status, &bytes)?))
        }
    }

    async fn read_file(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
        max: usize,
    ) -> Result<FileHead, Refusal> {
        let exchange = async {
            let response = self
                .send(
                    hyper::Method::GET,
                    &self.file_path(child, path.as_str()),
                    None,
                )
                .await?;
            let status = response.status();
            let is_json = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            if !status.is_success() || is_json {
                let (status, bytes) = bytes_of(response).await?;
                let value: Value = json_of(status, &bytes)?;
                return Err(if status.is_success() {
                    Refusal(format!(
                        "kernelbox: {path} is a directory; use list_files to see what it holds"
                    ))
                } else {
                    file_refusal(status, &value)
                });
            }
            let size = response
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let mut body = response.into_body();
            let mut bytes = Vec::new();
            while bytes.len() < max {
                match body.frame().await {
                    Some(frame) => {
                        let frame = frame.map_err(|e| {
                            Refusal(format!("kernelbox: reading the server's answer: {e}"))
                        })?;
                        if let Ok(data) = frame.into_data() {
                            bytes.extend_from_slice(&data);
                        }
                    }
                    None => break,
                }
            }
            // Dropping the rest of the body unread closes the connection.
            let read = bytes.len() as u64;
            bytes.truncate(max);
            Ok(FileHead {
                size: size.unwrap_or(read),
                bytes,
            })
        };
        within(FILE_DEADLINE, exchange).await?
    }

    async fn list_files(
        &self,
        _request: &Extensions,
        child: Option<&str>,
        path: &FilePath,
    ) -> Result<Listing, Refusal> {
        let url = self.file_path(child, path.as_str());
        let exchange = async {
            let response = self.send(hyper::Method::GET, &url, None).await?;
            let is_json = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            if response.status().is_success() && !is_json {
                return Err(Refusal(format!(
                    "kernelbox: {path} is a file, not a directory; use read_file"
                )));
            }
            let (status, bytes) = bytes_of(response).await?;
            if status.is_success() {
                json_of(status, &bytes)
            } else {
                Err(file_refusal(status, &json_of(status, &bytes)?))
            }
        };
        within(FILE_DEADLINE, exchange).await?
    }

    async fn close(&self) {
        if self.dispose {
            let path = crate::wire::path::session(&self.session);
            let _ = self
                .call_raw(hyper::Method::DELETE, &path, None, Duration::from_secs(30))
                .await;
        }
    }
}
