//! Tool calls in server mode: each call a cell makes is POSTed to the tenant's tool endpoint.
//!
//! Request body: `{"tenant", "session", "child", "task_id", "cell", "tool", "args"}`, with
//! header `X-Kernelbox-Cell-Token`: a random token minted for the cell (every call of one cell
//! carries the same token; no other cell's calls do). A 2xx JSON response is the tool's
//! result; any other status is an error the cell sees as `kernel_tools.ToolError`.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, USER_AGENT};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::metrics::Metrics;
use super::tenants::ToolsConfig;
use crate::authority::{RawToolCall, ToolCall, ToolDispatcher};
use crate::telemetry::Span;
use opentelemetry::trace::SpanKind;

/// Header carrying the per-cell token.
pub const CELL_TOKEN_HEADER: &str = "x-kernelbox-cell-token";

/// Largest tool endpoint response read into memory, in bytes; a longer one fails the call.
/// With [`crate::kernel::MAX_TOOL_CALLS_IN_FLIGHT`] this bounds the responses one cell can
/// make the server hold at once. A success is checked to be JSON and passed to the kernel as
/// it came, never parsed into a tree.
pub const MAX_RESPONSE_BYTES: usize = crate::kernel::MAX_TOOL_RESULT_BYTES;

/// The request body POSTed for one call; the arguments are copied through as raw JSON.
#[derive(Serialize)]
struct Body<'a> {
    tenant: &'a str,
    session: &'a str,
    child: Option<&'a str>,
    task_id: Option<&'a str>,
    cell: u64,
    tool: &'a str,
    args: &'a RawValue,
}

/// The shared HTTP client (plain HTTP/1.1, pooled).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A new pooled client.
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// The dispatcher for one cell.
pub struct CellDispatcher {
    client: HttpClient,
    tools: ToolsConfig,
    cell_token: String,
    metrics: Arc<Metrics>,
}

impl CellDispatcher {
    /// A dispatcher for one cell with a fresh token.
    pub fn new(client: HttpClient, tools: ToolsConfig, metrics: Arc<Metrics>) -> CellDispatcher {
        CellDispatcher {
            client,
            tools,
            cell_token: super::tenants::generate_token(),
            metrics,
        }
    }

    async fn post(&self, call: &RawToolCall) -> Result<Box<RawValue>, String> {
        let body = serde_json::to_vec(&Body {
            tenant: &call.tenant,
            session: &call.session,
            child: call.child.as_deref(),
            task_id: call.task_id.as_deref(),
            cell: call.cell,
            tool: &call.tool,
            args: &call.args,
        })
        .map_err(|e| format!("tool endpoint request: {e}"))?;
        let mut request = hyper::Request::post(&self.tools.url)
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("kernelbox/", env!("CARGO_PKG_VERSION")))
            .header(CELL_TOKEN_HEADER, &self.cell_token)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("tool endpoint request: {e}"))?;
        // The tool endpoint continues the caller's trace (docs/usage.md, "Traces").
        crate::telemetry::inject(request.headers_mut());
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("tool endpoint unreachable: {e}"))?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the tool endpoint's response: {e}"))?
            .to_bytes();
        if status.is_success() {
            // Validated as JSON without building a tree, and kept as its text.
            return serde_json::from_slice::<Box<RawValue>>(&bytes)
                .map_err(|e| format!("tool endpoint returned invalid JSON: {e}"));
        }
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| {
                let e = v.get("error")?;
                e.as_str()
                    .or_else(|| e.get("message").and_then(Value::as_str))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| {
                let text = String::from_utf8_lossy(&bytes);
                text.chars().take(500).collect::<String>()
            });
        Err(format!(
            "tool {:?} failed (HTTP {}): {message}",
            call.tool,
            status.as_u16()
        ))
    }
}

#[async_trait]
impl ToolDispatcher for CellDispatcher {
    async fn dispatch(&self, call: ToolCall) -> Result<Value, String> {
        let args = serde_json::value::to_raw_value(&call.args)
            .map_err(|e| format!("tool endpoint request: {e}"))?;
        let raw = RawToolCall {
            tool: call.tool,
            args,
            task_id: call.task_id,
            tenant: call.tenant,
            session: call.session,
            child: call.child,
            cell: call.cell,
        };
        let result = self.dispatch_raw(raw).await?;
        serde_json::from_str(result.get())
            .map_err(|e| format!("tool endpoint returned invalid JSON: {e}"))
    }

    async fn dispatch_raw(&self, call: RawToolCall) -> Result<Box<RawValue>, String> {
        let span = Span::start_kind("tool_call", SpanKind::Client);
        if span.is_on() {
            span.set("kernelbox.tool", call.tool.clone());
            span.set("url.full", self.tools.url.clone());
        }
        let posted = tokio::time::timeout(self.tools.timeout, self.post(&call));
        let result = match span.within(posted).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "tool {:?} did not answer within {}s",
                call.tool,
                self.tools.timeout.as_secs_f64()
            )),
        };
        self.metrics.tool_call(result.is_ok());
        if let Err(e) = &result {
            span.fail(e.clone());
        }
        result
    }
}
