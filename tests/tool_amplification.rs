//! A cell's tool-call arguments cost the server about their size, not a parsed tree of them.
//!
//! The real server runs in this process (alone in this test binary, so its resident memory is
//! the server's) with a tenant whose tool endpoint holds every call until the test releases
//! it. A cell starts 16 threads that each call `kernel_tools.web_search(q=[0]*260000)`: about
//! 520 KB of JSON on the wire each, whose `serde_json::Value` tree would take over 8 MB. While
//! the calls are held, the server's memory must stay well under what trees would cost.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use http::{tenant, tenants, TestServer};

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// What the tool endpoint saw: calls that arrived (their bodies read in full), and a gate
/// that holds every call until the test opens it.
#[derive(Clone)]
struct Endpoint {
    arrived: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
}

/// A tool endpoint that keeps each request body as bytes (never parsed) until released.
async fn slow_tool_endpoint(endpoint: Endpoint) -> std::net::SocketAddr {
    use axum::extract::State;
    use axum::routing::post;
    async fn handle(State(endpoint): State<Endpoint>, body: Bytes) -> &'static str {
        endpoint.arrived.fetch_add(1, Ordering::AcqRel);
        let _held = body;
        let _permit = endpoint.gate.acquire().await;
        "{\"ok\": true}"
    }
    let app = axum::Router::new()
        .route("/tools", post(handle))
        .layer(axum::extract::DefaultBodyLimit::max(4 << 20))
        .with_state(endpoint);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

const MIB: f64 = 1024.0 * 1024.0;

#[tokio::test(flavor = "multi_thread")]
async fn big_tool_call_arguments_cost_the_server_about_their_size() {
    let endpoint = Endpoint {
        arrived: Arc::default(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let addr = slow_tool_endpoint(endpoint.clone()).await;
    let mut entry = tenant("acme", "tok");
    entry["tools"] = json!({"url": format!("http://{addr}/tools"), "allow": ["web_search"],
                            "timeout_seconds": 300});
    let srv = TestServer::start("tool-amplification", tenants(vec![entry]), |_| {}).await;
    let api = srv.api.clone();
    // The kernel is up and the runner's tool module loaded before the baseline.
    // (With the same tool set: it is part of the kernel's key.)
    let warm = api
        .execute(
            "tok",
            "s",
            json!({"code": "import kernel_tools, threading", "tools": ["web_search"]}),
        )
        .await
        .json();
    assert_eq!(warm["status"], "success", "{warm}");
    let before = rss();

    let code = "\
results = []
def call():
    try:
        kernel_tools.web_search(q=[0] * 260000)
        results.append('done')
    except kernel_tools.ToolError as e:
        print('refused:', str(e)[:80], flush=True)
        results.append('refused')
threads = [threading.Thread(target=call) for _ in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(results.count('done'), results.count('refused'))";
    let mut events = api
        .stream(
            "tok",
            "s",
            json!({"code": code, "tools": ["web_search"], "timeout": 300}),
        )
        .await;
    let refused = Arc::new(AtomicUsize::new(0));
    let reading = {
        let refused = refused.clone();
        tokio::spawn(async move {
            loop {
                let event = events.next().await.expect("stream ended without a result");
                match event["event"].as_str() {
                    Some("output") => {
                        let data = event["data"].as_str().unwrap_or_default();
                        refused.fetch_add(data.matches("refused:").count(), Ordering::AcqRel);
                    }
                    Some("result") => return event["result"].clone(),
                    _ => panic!("unexpected event {event}"),
                }
            }
        })
    };
    // Every call is either held at the endpoint or refused; meanwhile the server holds what
    // it holds for the held ones. Sampled until then (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut peak = rss();
    loop {
        peak = peak.max(rss());
        let settled =
            endpoint.arrived.load(Ordering::Acquire) + refused.load(Ordering::Acquire) >= 16;
        if settled || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    peak = peak.max(rss());
    let arrived = endpoint.arrived.load(Ordering::Acquire);
    endpoint.gate.add_permits(1000);
    let result = tokio::time::timeout(Duration::from_secs(300), reading)
        .await
        .expect("the cell finishes once the tools answer")
        .expect("reader task");
    let growth = peak.saturating_sub(before);
    eprintln!(
        "server RSS {:.1} MiB -> peak {:.1} MiB (+{:.1} MiB) with {arrived} calls held and {} refused",
        before as f64 / MIB,
        peak as f64 / MIB,
        growth as f64 / MIB,
        refused.load(Ordering::Acquire)
    );
    assert_eq!(
        arrived + refused.load(Ordering::Acquire),
        16,
        "every call was held or refused: {result}"
    );
    assert!(
        growth < 64 * 1024 * 1024,
        "the server grew by {:.1} MiB for one kernel's tool calls",
        growth as f64 / MIB
    );
    assert_eq!(result["status"], "success", "{result}");
    let output = result["output"].as_str().unwrap_or_default();
    assert!(
        output
            .trim_end()
            .ends_with(&format!("{arrived} {}", 16 - arrived)),
        "{result}"
    );
    srv.finish().await;
}
