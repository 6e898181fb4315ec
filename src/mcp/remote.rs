//! The remote backend: `kernelbox mcp --url` calling a kernelbox server's HTTP API
//! (`POST /v1/sessions/{session}/execute`, `DELETE /v1/sessions/{session}`) for one session.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rmcp::model::Extensions;
use serde_json::{json, Value};

use super::backend::{Backend, ExecuteCode, Refusal};

/// Largest response read from the server (a cell result with its rich results).
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// How long past the cell's own timeout (the server's longest, 1 h, when none is given) a call
/// may wait for the server before it is abandoned.
const SLACK: Duration = Duration::from_secs(60);
const LONGEST_CELL: Duration = Duration::from_secs(3600);

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

    async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Value>,
        deadline: Duration,
    ) -> Result<(hyper::StatusCode, Value), Refusal> {
        let uri = format!("{}{path}", self.base);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(&uri)
            .header(ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Refusal(format!("kernelbox: bad server URL {uri:?}: {e}")))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                Refusal(format!(
                    "kernelbox: cannot reach the kernelbox server at {}: {e}",
                    self.base
                ))
            })?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| Refusal(format!("kernelbox: reading the server's answer: {e}")))?
                .to_bytes();
            let value: Value = serde_json::from_slice(&bytes).map_err(|_| {
                Refusal(format!(
                    "kernelbox: the server answered {status} with something that is not JSON"
                ))
            })?;
            Ok((status, value))
        };
        tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| {
                Refusal(format!(
                    "kernelbox: the server did not answer within {}",
                    humantime::format_duration(deadline)
                ))
            })?
    }
}

#[async_trait]
impl Backend for RemoteBackend {
    async fn execute(&self, _request: &Extensions, args: ExecuteCode) -> Result<Value, Refusal> {
        let mut body = json!({"code": args.code, "reset": args.reset});
        if let Some(timeout) = args.timeout {
            body["timeout"] = json!(timeout);
        }
        let cell = args
            .timeout
            .and_then(|t| Duration::try_from_secs_f64(t).ok())
            .unwrap_or(LONGEST_CELL)
            .min(LONGEST_CELL);
        let path = format!("/v1/sessions/{}/execute", self.session);
        let (status, value) = self
            .call(hyper::Method::POST, &path, Some(body), cell + SLACK)
            .await?;
        if status.is_success() {
            Ok(value)
        } else {
            let message = value["error"]["message"]
                .as_str()
                .unwrap_or("request failed");
            Err(Refusal(format!(
                "the kernelbox server refused the cell ({status}): {message}"
            )))
        }
    }

    async fn close(&self) {
        if self.dispose {
            let path = format!("/v1/sessions/{}", self.session);
            let _ = self
                .call(hyper::Method::DELETE, &path, None, Duration::from_secs(30))
                .await;
        }
    }
}
