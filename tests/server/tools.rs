//! Tool calls from a cell to the tenant's real tool endpoint.

use std::net::SocketAddr;

use hyper::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use kernelbox::server;

use crate::http::{tenant, tenants, TestServer};

/// A tool endpoint: records each call, answers `web_search` and fails `broken`.
async fn tool_endpoint() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(String, Value)>,
) {
    use axum::extract::State;
    use axum::routing::post;
    type Calls = tokio::sync::mpsc::UnboundedSender<(String, Value)>;
    async fn handle(
        State(calls): State<Calls>,
        headers: HeaderMap,
        axum::Json(call): axum::Json<Value>,
    ) -> (StatusCode, axum::Json<Value>) {
        let token = headers
            .get(server::CELL_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let _ = calls.send((token, call.clone()));
        match call["tool"].as_str() {
            Some("web_search") => (StatusCode::OK, axum::Json(json!({"echo": call["args"]}))),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"error": "boom"})),
            ),
        }
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new()
        .route("/tools", post(handle))
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_reach_the_tenants_endpoint_and_only_allowed_tools_run() {
    let (tools_addr, mut calls) = tool_endpoint().await;
    let mut entry = tenant("acme", "tok");
    entry["tools"] =
        json!({"url": format!("http://{tools_addr}/tools"), "allow": ["web_search", "broken"]});
    let srv = TestServer::start(
        "srv-tools",
        tenants(vec![entry, tenant("other", "tok-other")]),
        |_| {},
    )
    .await;
    let api = &srv.api;

    let code = r#"
import kernel_tools
r = kernel_tools.web_search(q="rust")
print(r["echo"]["q"])
for name in ("rm_rf", "broken"):
    try:
        kernel_tools.call(name, path="/")
    except kernel_tools.ToolError as e:
        print(name, "refused:", e)
"#;
    let reply = api
        .execute("tok", "s", json!({"code": code, "task_id": "turn-7"}))
        .await;
    let result = reply.json();
    assert_eq!(result["status"], "success", "{result}");
    let output = result["output"].as_str().expect("output");
    assert!(output.starts_with("rust\n"), "{output}");
    assert!(output.contains("rm_rf refused: Unknown tool"), "{output}");
    assert!(
        output.contains("broken refused:") && output.contains("boom"),
        "{output}"
    );
    assert_eq!(result["tool_calls_made"], 2);

    let (token1, first) = calls.recv().await.expect("a call");
    assert_eq!(first["tool"], "web_search");
    assert_eq!(first["args"], json!({"q": "rust"}));
    assert_eq!(first["tenant"], "acme");
    assert_eq!(first["session"], "s");
    assert_eq!(first["task_id"], "turn-7");
    assert!(first["cell"].as_u64().is_some(), "{first}");
    let (token1b, second) = calls.recv().await.expect("a second call");
    assert_eq!(second["tool"], "broken");
    assert_eq!(token1.len(), 64);
    assert_eq!(token1, token1b, "one token per cell");
    assert!(
        calls.try_recv().is_err(),
        "the refused tool never reached the endpoint"
    );

    // The next cell carries a different token.
    api.run("tok", "s", "kernel_tools.web_search(q='again')")
        .await;
    let (token2, _) = calls.recv().await.expect("a call");
    assert_ne!(token1, token2);

    // A tenant without tools has none, and cannot ask for any.
    let r = api
        .execute(
            "tok-other",
            "s",
            json!({"code": "import kernel_tools\nkernel_tools.web_search(q='x')"}),
        )
        .await;
    assert_eq!(r.json()["status"], "error");
    assert!(calls.try_recv().is_err());
    let r = api
        .execute(
            "tok",
            "s",
            json!({"code": "1", "tools": ["web_search", "nope"]}),
        )
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "tool_not_allowed");

    let m = api.get("/metrics", Some("tok")).await;
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(
        text.contains("kernelbox_tool_calls_total{outcome=\"ok\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_tool_calls_total{outcome=\"error\"} 1"),
        "{text}"
    );
    srv.finish().await;
}
