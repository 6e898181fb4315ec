//! docs/cluster.md, "Routing": a session's state whichever node a request reaches (the
//! balancer's pick or any node directly: the wrong ones forward), one hop at most, NDJSON
//! events and large files streamed through the hop with flat memory, and first calls racing
//! on two nodes settled on one kernel.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::{Method, StatusCode};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::common::{memory_of, MIB};
use crate::harness::{self, generation, kernel_id, success, Cluster, Options, TOKEN};
use crate::http::files;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_persists_across_cells_whichever_node_the_balancer_picks() {
    let cluster = Cluster::start(
        "cl-persist",
        Options {
            balancer: true,
            ..Options::default()
        },
    )
    .await;
    let lb = &cluster.balancer().api;
    let sessions: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    let mut kernels = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        let result = success(
            &lb.execute(TOKEN, s, json!({ "code": format!("x = {i}") }))
                .await,
        );
        kernels.push(kernel_id(&result));
    }
    let mut spread = [0usize; 3];
    for (i, s) in sessions.iter().enumerate() {
        let result = success(&lb.execute(TOKEN, s, json!({"code": "print(x)"})).await);
        assert_eq!(result["output"], format!("{i}\n"), "{s} through HAProxy");
        assert_eq!(kernel_id(&result), kernels[i], "{s}: the same kernel");
        // Directly to each node: two of them do not hold the session and forward it.
        for node in &cluster.nodes {
            let result = success(
                &node
                    .api
                    .execute(TOKEN, s, json!({"code": "print(x)"}))
                    .await,
            );
            assert_eq!(
                result["output"],
                format!("{i}\n"),
                "{s} through {}",
                node.name
            );
            assert_eq!(kernel_id(&result), kernels[i], "{s} through {}", node.name);
            assert_eq!(result["kernel"]["reused"], true, "{result}");
        }
        let holder = cluster.holder(s).await.expect("a node holds the session");
        spread[holder] += 1;
        assert_eq!(
            cluster.session_containers(s).await.len(),
            1,
            "one kernel for {s}"
        );
    }
    eprintln!("12 sessions through HAProxy, held per node: {spread:?}");
    assert_eq!(
        cluster.containers().await.len(),
        12,
        "one kernel per session"
    );
    cluster.finish().await;
}

/// The content of the test file, 1 MiB chunk `i` of it: bytes no two chunks share, from a
/// small xorshift generator.
fn chunk(i: u64) -> Bytes {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ (i + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut out = Vec::with_capacity(1 << 20);
    for _ in 0..(1 << 17) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    Bytes::from(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_forwarded_once_and_streams_through_the_hop() {
    let cluster = Cluster::start("cl-hop", Options::default()).await;
    let (owner, other) = (&cluster.nodes[0], &cluster.nodes[1]);
    success(
        &owner
            .api
            .execute(TOKEN, "held", json!({"code": "x = 1"}))
            .await,
    );

    // A client cannot mark its request forwarded: without the hop secret the mark is
    // ignored and the request goes to the holder as any other.
    let spoofed = success(&other.execute_forwarded("held", "print(x)", None).await);
    assert_eq!(spoofed["output"], "1\n");
    // A request that was already forwarded once is refused by a node not holding the
    // session (never a second hop): an execute, and a request that starts nothing.
    let hop = cluster.hop_secret().await;
    let reply = other
        .execute_forwarded("held", "print(x)", Some(&hop))
        .await;
    assert_eq!(
        reply.error(StatusCode::MISDIRECTED_REQUEST),
        "second_hop_refused"
    );
    let request = other
        .api
        .build(
            Method::GET,
            &files("held", "a.txt"),
            Some(TOKEN),
            false,
            false,
        )
        .header(harness::FORWARDED, "someone")
        .header(harness::HOP, &hop)
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("request");
    let reply = crate::http::Reply::read(other.api.http.request(request).await.expect("GET")).await;
    assert_eq!(
        reply.error(StatusCode::MISDIRECTED_REQUEST),
        "second_hop_refused"
    );
    // The owner serves a forwarded request itself.
    let result = success(
        &owner
            .execute_forwarded("held", "print(x)", Some(&hop))
            .await,
    );
    assert_eq!(result["output"], "1\n");

    // NDJSON through the hop: in order, and as produced (the second half comes a second
    // after the first, so a hop that buffered the answer would deliver them together).
    let code = "import time\nfor i in range(1, 26):\n    print(i, flush=True)\ntime.sleep(1)\n\
                for i in range(26, 51):\n    print(i, flush=True)";
    let mut events = other
        .api
        .stream(TOKEN, "held", json!({ "code": code }))
        .await;
    let mut text = String::new();
    let mut outputs = 0;
    let mut first_half_at = None;
    let result = loop {
        let event = events
            .next()
            .await
            .expect("the stream ended without a result");
        match event["event"].as_str() {
            Some("output") => {
                outputs += 1;
                text.push_str(event["data"].as_str().expect("data"));
                if first_half_at.is_none() && text.contains("25\n") {
                    first_half_at = Some(Instant::now());
                }
            }
            Some("result") => break event["result"].clone(),
            _ => panic!("unexpected event {event}"),
        }
    };
    let expected: String = (1..=50).map(|i| format!("{i}\n")).collect();
    assert_eq!(text, expected, "the events in order");
    assert_eq!(result["status"], "success", "{result}");
    let gap = first_half_at.expect("the first half").elapsed();
    assert!(
        outputs >= 2 && gap >= Duration::from_millis(500),
        "the events streamed through the hop as produced: {outputs} output events, the \
         first half {gap:?} before the end"
    );

    // 100 MiB up and down through the node that does not hold the session: the same bytes,
    // and that node's memory flat.
    let chunks = 100u64;
    let mut hash = Sha256::new();
    for i in 0..chunks {
        hash.update(chunk(i));
    }
    let want = hex::encode(hash.finalize());
    let pid = other.pid();
    let (rss_before, _) = memory_of(pid);
    let body =
        futures::stream::iter((0..chunks).map(|i| Ok::<_, std::io::Error>(Frame::data(chunk(i)))));
    let started = Instant::now();
    let upload = other
        .api
        .put_stream(&files("held", "big.bin"), TOKEN, body)
        .await
        .expect("the upload task")
        .expect("the upload");
    let up = started.elapsed();
    assert_eq!(upload.status, StatusCode::CREATED, "{}", upload.json());
    assert_eq!(upload.json()["size"], chunks << 20);
    let result = success(
        &owner
            .api
            .execute(
                TOKEN,
                "held",
                json!({"code": "import hashlib\nprint(hashlib.sha256(open('big.bin','rb').read()).hexdigest())"}),
            )
            .await,
    );
    assert_eq!(
        result["output"],
        format!("{want}\n"),
        "the kernel has the bytes sent"
    );

    let started = Instant::now();
    let request = other
        .api
        .build(
            Method::GET,
            &files("held", "big.bin"),
            Some(TOKEN),
            false,
            false,
        )
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("request");
    let response = other.api.http.request(request).await.expect("GET");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut hash = Sha256::new();
    let mut received = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("download frame").into_data() {
            received += data.len() as u64;
            hash.update(&data);
        }
    }
    let down = started.elapsed();
    assert_eq!(received, chunks << 20);
    assert_eq!(hex::encode(hash.finalize()), want, "the bytes downloaded");
    let (rss_after, hwm_after) = memory_of(pid);
    let growth = hwm_after.saturating_sub(rss_before);
    eprintln!(
        "100 MiB through a forwarding node: up {:.0} MiB/s, down {:.0} MiB/s; its VmRSS {:.1} -> {:.1} MiB, peak {:.1} MiB above the start",
        100.0 / up.as_secs_f64(),
        100.0 / down.as_secs_f64(),
        rss_before as f64 / MIB,
        rss_after as f64 / MIB,
        growth as f64 / MIB,
    );
    assert!(
        growth < 50 * 1024 * 1024,
        "the forwarding node's memory grew by {:.1} MiB",
        growth as f64 / MIB
    );
    assert_eq!(cluster.containers().await.len(), 1, "one kernel in all");
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_calls_racing_on_two_nodes_get_one_kernel() {
    let cluster = Cluster::start("cl-race", Options::default()).await;
    let (a, b) = (&cluster.nodes[0].api, &cluster.nodes[1].api);
    for round in 0..3 {
        let session = format!("race{round}");
        let code = json!({"code": "import os\nprint(os.getpid())"});
        let (ra, rb) = tokio::join!(
            a.execute(TOKEN, &session, code.clone()),
            b.execute(TOKEN, &session, code.clone())
        );
        let (ra, rb) = (success(&ra), success(&rb));
        assert_eq!(kernel_id(&ra), kernel_id(&rb), "{ra}\n{rb}");
        assert_eq!(generation(&ra), generation(&rb));
        let containers = cluster.session_containers(&session).await;
        assert_eq!(
            containers.len(),
            1,
            "one kernel for {session}: {containers:?}"
        );
        assert!(containers[0].id.starts_with(&kernel_id(&ra)));
    }
    cluster.finish().await;
}

/// One JSON-RPC message to `/v1/mcp?session=SESSION` (`/v1/mcp` when SESSION is empty) on
/// `node`; the answer's JSON-RPC
/// message (from a JSON body or the first SSE `data:` line), and its MCP session id.
async fn mcp(
    node: &crate::harness::Node,
    session: &str,
    mcp_session: Option<&str>,
    message: serde_json::Value,
) -> (Option<serde_json::Value>, Option<String>) {
    let mut request = node
        .api
        .build(
            Method::POST,
            &if session.is_empty() {
                "/v1/mcp".to_string()
            } else {
                format!("/v1/mcp?session={session}")
            },
            Some(TOKEN),
            false,
            true,
        )
        .header("accept", "application/json, text/event-stream");
    if let Some(id) = mcp_session {
        request = request.header("mcp-session-id", id);
    }
    let request = request
        .body(http_body_util::Full::new(Bytes::from(message.to_string())))
        .expect("request");
    let reply =
        crate::http::Reply::read(node.api.http.request(request).await.expect("MCP call")).await;
    assert!(
        reply.status.is_success(),
        "{} {:?}",
        reply.status,
        reply.body
    );
    let id = reply
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = String::from_utf8_lossy(&reply.body).to_string();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .find(|d| d.starts_with('{'))
        .or_else(|| Some(text.trim()).filter(|t| t.starts_with('{')))
        .and_then(|t| serde_json::from_str(t).ok());
    (json, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_naming_a_session_reaches_the_node_holding_it() {
    let cluster = Cluster::start("cl-mcp", Options::default()).await;
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let held = success(&a.api.execute(TOKEN, "m1", json!({"code": "x = 7"})).await);
    // MCP on node B, naming the session node A holds: its tools run in A's kernel.
    let (init, id) = mcp(
        b,
        "m1",
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "cluster-test", "version": "1"}}}),
    )
    .await;
    assert!(
        init.is_some_and(|i| i["result"].is_object()),
        "initialize answered"
    );
    let id = id.expect("an MCP session id");
    mcp(
        b,
        "m1",
        Some(&id),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (called, _) = mcp(
        b,
        "m1",
        Some(&id),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "execute_code", "arguments": {"code": "print(x)"}}}),
    )
    .await;
    let called = called.expect("a tool result");
    assert!(called.to_string().contains("7\\n"), "{called}");
    // One kernel for the session, on A.
    let containers = cluster.session_containers("m1").await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(cluster.holder("m1").await, Some(0));
    assert_eq!(
        kernel_id(&success(
            &a.api.execute(TOKEN, "m1", json!({"code": "x"})).await
        )),
        kernel_id(&held)
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_naming_no_session_is_served_by_the_node_that_made_it() {
    let cluster = Cluster::start("cl-mcpid", Options::default()).await;
    let (a, b, c) = (&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]);
    // Made on A, naming no kernelbox session: it lives on A only.
    let (init, id) = mcp(
        a,
        "",
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "cluster-test", "version": "1"}}}),
    )
    .await;
    assert!(
        init.is_some_and(|i| i["result"].is_object()),
        "initialize answered"
    );
    let id = id.expect("an MCP session id");
    // Its next requests reach B and C (no tool run yet, so no catalog row says where it is).
    mcp(
        b,
        "",
        Some(&id),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (listed, _) = mcp(
        c,
        "",
        Some(&id),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    let listed = listed.expect("the tools");
    assert!(listed.to_string().contains("execute_code"), "{listed}");
    let (called, _) = mcp(
        b,
        "",
        Some(&id),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "execute_code", "arguments": {"code": "x = 5\nprint(x * 2)"}}}),
    )
    .await;
    let called = called.expect("a tool result");
    assert!(called.to_string().contains("10\\n"), "{called}");
    // Its kernel runs on A, the node that made it.
    let kernel_session = format!("mcp-{id}");
    let containers = cluster.session_containers(&kernel_session).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(
        containers[0].labels.get(kernelbox::labels::INSTANCE),
        Some(&a.instance)
    );
    cluster.finish().await;
}

/// A session-less MCP request (protocol 2026-07-28: no MCP session, its version in a header
/// and in the request's `_meta`) to `/v1/mcp` on `node`, naming no kernelbox session; the
/// JSON-RPC answer.
async fn mcp_sessionless(node: &crate::harness::Node, id: u64, code: &str) -> serde_json::Value {
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"code": code},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    let request = node
        .api
        .build(Method::POST, "/v1/mcp", Some(TOKEN), false, true)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "execute_code")
        .body(http_body_util::Full::new(Bytes::from(message.to_string())))
        .expect("request");
    let reply =
        crate::http::Reply::read(node.api.http.request(request).await.expect("MCP call")).await;
    let text = String::from_utf8_lossy(&reply.body).to_string();
    assert!(reply.status.is_success(), "{} {text}", reply.status);
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .find(|d| d.starts_with('{'))
        .or_else(|| Some(text.trim()).filter(|t| t.starts_with('{')))
        .and_then(|t| serde_json::from_str(t).ok())
        .expect("a JSON-RPC answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_mcp_calls_naming_no_session_share_the_default_session_on_any_node() {
    let cluster = Cluster::start("cl-mcpdef", Options::default()).await;
    let (a, b, c) = (&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]);
    let first = mcp_sessionless(a, 1, "x = 20").await;
    assert_eq!(first["result"]["isError"], false, "{first}");
    // Through the two other nodes, the same kernel: routed as a request naming mcp-default.
    for (n, node) in [(2, b), (3, c)] {
        let called = mcp_sessionless(node, n, "x += 1\nprint(x)").await;
        assert!(
            called.to_string().contains(&format!("{}\\n", 19 + n)),
            "{called}"
        );
    }
    let containers = cluster.session_containers("mcp-default").await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert!(cluster.holder("mcp-default").await.is_some());
    cluster.finish().await;
}
