//! OpenTelemetry traces (`docs/usage.md`, "Traces") over real HTTP against the real engine:
//! an OTLP/HTTP receiver started by the test collects what the server sends; a caller's W3C
//! `traceparent` is continued (the request span is its child, every span has its trace id),
//! the span tree is the request's admission, cold start (volume, create, start, ready), cell
//! and tool call, and the tenant's tool endpoint receives the tool call's `traceparent`; an
//! upload's file transfer and a streaming execute's cell stay in their callers' traces, and a
//! request without a `traceparent` starts a trace of its own.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;
#[path = "common/otlp.rs"]
mod otlp;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};

use http::{tenant, tenants, Reply, TestServer};
use otlp::{one, receiver, Span};

/// A tool endpoint on loopback: answers every call, recording its `traceparent` header.
async fn tool_endpoint() -> (SocketAddr, Arc<Mutex<Vec<Option<String>>>>) {
    use axum::extract::State;
    use axum::routing::post;
    type Seen = Arc<Mutex<Vec<Option<String>>>>;
    async fn handle(State(seen): State<Seen>, headers: HeaderMap) -> axum::Json<Value> {
        let traceparent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        seen.lock().unwrap().push(traceparent);
        axum::Json(json!({"answer": 42}))
    }
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/tools", post(handle))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

/// Sends `method path` with the caller's `traceparent` (asking for NDJSON when `ndjson`).
async fn send_traced(
    srv: &TestServer,
    method: Method,
    path: &str,
    traceparent: &str,
    body: Bytes,
    ndjson: bool,
) -> Reply {
    let api = &srv.api;
    let request = api
        .build(method, path, Some("tok"), ndjson, true)
        .header("traceparent", traceparent)
        .body(Full::new(body))
        .unwrap();
    Reply::read(api.http.request(request).await.unwrap()).await
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const UPLOAD_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const STREAM_TRACE: &str = "5b8efff798038103d269b633813fc60c";

#[tokio::test(flavor = "multi_thread")]
async fn a_callers_trace_continues_through_admission_cold_start_cell_and_tool_call() {
    let (otlp, collected) = receiver().await;
    let (tools, seen) = tool_endpoint().await;
    let telemetry = kernelbox::telemetry::init(&format!("http://{otlp}"), "kernelbox-test")
        .expect("the trace pipeline starts");
    let mut entry = tenant("acme", "tok");
    entry["tools"] = json!({"url": format!("http://{tools}/tools"), "allow": ["lookup"]});
    let srv = TestServer::start_with(
        "tracing",
        tenants(vec![entry]),
        // No warm pool: the first cell starts its kernel cold.
        |config| config.pool.size = 0,
        |state| state.trace_with(telemetry.tracer()),
    )
    .await;

    let code = "import kernel_tools\nprint(kernel_tools.lookup(q='x')['answer'])\n";
    let reply = send_traced(
        &srv,
        Method::POST,
        "/v1/sessions/traced/execute",
        &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"),
        Bytes::from(json!({"code": code}).to_string()),
        false,
    )
    .await;
    let result = reply.json();
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["output"], "42\n", "{result}");
    let request_id = reply.headers["x-request-id"].to_str().unwrap().to_string();

    // A file into the same session's (now warm) kernel, in a trace of its own.
    let reply = send_traced(
        &srv,
        Method::PUT,
        "/v1/sessions/traced/files/notes.txt",
        &format!("00-{UPLOAD_TRACE}-{CALLER_SPAN}-01"),
        Bytes::from_static(b"hello"),
        false,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.json());

    // A streaming execute: the response starts before the cell ends, whose span stays in
    // the request's trace.
    let reply = send_traced(
        &srv,
        Method::POST,
        "/v1/sessions/traced/execute",
        &format!("00-{STREAM_TRACE}-{CALLER_SPAN}-01"),
        Bytes::from(json!({"code": "print('streamed')"}).to_string()),
        true,
    )
    .await;
    let body = String::from_utf8_lossy(&reply.body).to_string();
    assert!(body.contains("streamed"), "{body}");

    // A request without a traceparent starts a trace of its own.
    assert_eq!(srv.api.kernels("tok").await.len(), 1);

    telemetry.flush().await.expect("the spans are sent");
    let names = [
        "http.request",
        "admission",
        "cold_start",
        "volume",
        "create",
        "start",
        "ready",
        "cell",
        "tool_call",
    ];
    let spans = collected.trace(CALLER_TRACE, &names).await;
    for span in &spans {
        assert_eq!(span.service, "kernelbox-test", "{span:?}");
    }

    let request = one(&spans, "http.request");
    assert_eq!(request.parent, CALLER_SPAN, "a child of the caller's span");
    assert_eq!(request.attr("http.request.method"), Some(&json!("POST")));
    assert_eq!(
        request.attr("http.route"),
        Some(&json!("/v1/sessions/{session}/execute"))
    );
    assert_eq!(request.attr("kernelbox.tenant"), Some(&json!("acme")));
    // The request id the answer carried (docs/logs.md, "Request ids").
    assert_eq!(request.attr("http.request.id"), Some(&json!(request_id)));
    // OTLP JSON carries 64-bit integers as strings.
    let status = request.attr("http.response.status_code").unwrap();
    assert!(status == &json!("200") || status == &json!(200), "{status}");

    let child_of = |name: &str, parent: &Span| {
        let span = one(&spans, name);
        assert_eq!(
            span.parent, parent.id,
            "{name} is a child of {}: {spans:#?}",
            parent.name
        );
        span.clone()
    };
    child_of("admission", request);
    let cold = child_of("cold_start", request);
    for step in ["volume", "create", "start", "ready"] {
        child_of(step, &cold);
    }
    let cell = child_of("cell", request);
    assert_eq!(cell.attr("kernelbox.cell.status"), Some(&json!("success")));
    let tool_call = child_of("tool_call", &cell);
    assert_eq!(tool_call.attr("kernelbox.tool"), Some(&json!("lookup")));

    // The tool endpoint continued the same trace, under the tool call's span.
    let received = seen.lock().unwrap().clone();
    assert_eq!(
        received,
        vec![Some(format!("00-{CALLER_TRACE}-{}-01", tool_call.id))],
        "the tool endpoint's traceparent"
    );

    // The upload: its own trace, the request's file transfer with its size.
    let upload = collected
        .trace(UPLOAD_TRACE, &["http.request", "file_transfer"])
        .await;
    let request = one(&upload, "http.request");
    assert_eq!(request.parent, CALLER_SPAN);
    let transfer = one(&upload, "file_transfer");
    assert_eq!(transfer.parent, request.id);
    assert_eq!(
        transfer.attr("kernelbox.file.direction"),
        Some(&json!("upload"))
    );
    let bytes = transfer.attr("kernelbox.file.bytes").unwrap();
    assert!(bytes == &json!("5") || bytes == &json!(5), "{bytes}");
    assert!(
        upload.iter().all(|s| s.name != "cold_start"),
        "the kernel was warm: {upload:#?}"
    );

    let stream = collected
        .trace(STREAM_TRACE, &["http.request", "admission", "cell"])
        .await;
    let request = one(&stream, "http.request");
    assert_eq!(request.parent, CALLER_SPAN);
    assert_eq!(one(&stream, "cell").parent, request.id);
    assert_eq!(one(&stream, "admission").parent, request.id);

    let own = collected
        .until(
            "the untraced request's span",
            |s| s.attr("http.route") == Some(&json!("/v1/kernels")),
            |spans| !spans.is_empty(),
        )
        .await
        .remove(0);
    assert_eq!(own.parent, "", "a root span: {own:?}");
    assert!(
        ![CALLER_TRACE, UPLOAD_TRACE, STREAM_TRACE].contains(&own.trace.as_str()),
        "{own:?}"
    );

    srv.finish().await;
    telemetry.shutdown().await.expect("the pipeline stops");
}
