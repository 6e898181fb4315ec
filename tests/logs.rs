//! Logs an operator can ship (docs/logs.md), read from the real `kernelbox serve` binary's
//! stderr: with `--log-format json` every line is a JSON object; each request is one access
//! event (tenant, session, route template, status, bytes, the request id the response carried)
//! whether answered whole, streamed, refused or unauthenticated, and no token or cell code is
//! ever logged; a kernel's start, loss (a cell's timeout) and removal are lifecycle events. The
//! text format stays the default.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use http::Api;

/// The server's stderr lines, collected by a task from the start (a full pipe would block the
/// server); all of them once it has exited.
struct Stderr {
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Stderr {
    /// Starts the server (`serve_command` with `args`), waits for its address, and collects
    /// every stderr line, the serving line included.
    async fn serve(
        label: &str,
        token: &str,
        args: &[&str],
        state: &std::path::Path,
    ) -> (tokio::process::Child, std::net::SocketAddr, Stderr) {
        let mut child = common::serve_command(label, token)
            .args(args)
            .env("KERNELBOX_STATE_DIR", state)
            .env_remove("KERNELBOX_LOG")
            .env_remove("KERNELBOX_LOG_FORMAT")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn kernelbox serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            let mut addr_tx = Some(addr_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split("on http://").nth(1) {
                    let addr = rest.split_whitespace().next().expect("address");
                    if let Some(tx) = addr_tx.take() {
                        let _ = tx.send(addr.parse::<std::net::SocketAddr>().expect("address"));
                    }
                }
                let _ = tx.send(line);
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(60), addr_rx)
            .await
            .expect("the server serves within 60 s")
            .expect("the server exited before serving");
        (child, addr, Stderr { lines: rx })
    }

    /// Every line, once the server has exited and its stderr closed.
    async fn all(mut self) -> Vec<String> {
        let mut all = Vec::new();
        while let Some(line) = self.lines.recv().await {
            all.push(line);
        }
        all
    }
}

/// A request with an optional token and `x-request-id`; the response read in full.
async fn send(
    api: &Api,
    method: Method,
    path: &str,
    token: Option<&str>,
    request_id: Option<&str>,
    body: Option<&str>,
    ndjson: bool,
) -> http::Reply {
    let mut req = api.build(method, path, token, ndjson, body.is_some());
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default().to_string())))
        .expect("request");
    let response = api.http.request(req).await.expect("HTTP request");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    http::Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// The response's `x-request-id`.
fn request_id(reply: &http::Reply) -> String {
    reply
        .headers
        .get("x-request-id")
        .unwrap_or_else(|| panic!("{}: no x-request-id", reply.status))
        .to_str()
        .unwrap()
        .to_string()
}

/// The one access event of `id`.
fn access<'a>(events: &'a [Value], id: &str) -> &'a Value {
    let found: Vec<&Value> = events
        .iter()
        .filter(|e| e["target"] == "kernelbox::access" && e["request_id"] == id)
        .collect();
    assert_eq!(found.len(), 1, "one access event for {id}: {found:?}");
    found[0]
}

/// The lifecycle events, in order.
fn lifecycle(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["target"] == "kernelbox::lifecycle")
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_json_log_has_one_access_event_per_request_and_the_kernels_lifecycle() {
    let label = common::unique("logs-json");
    let engine = common::engine().await;
    let state = tempfile::tempdir().expect("state dir");
    let token = common::unique("tok-logs-secret");
    let (mut child, addr, stderr) = Stderr::serve(
        &label,
        &token,
        &["--log-format", "json", "--pool", "0"],
        state.path(),
    )
    .await;
    let api = Api::new(addr);
    let marker = common::unique("CELLCODE");
    let path = "/v1/sessions/logs-s1/execute";

    // A whole execute, with the caller's request id.
    let code = json!({ "code": format!("secret = '{marker}'\nlen(secret)") }).to_string();
    let whole = send(
        &api,
        Method::POST,
        path,
        Some(&token),
        Some("req-whole.1"),
        Some(&code),
        false,
    )
    .await;
    assert_eq!(whole.status, StatusCode::OK, "{}", whole.json());
    assert_eq!(request_id(&whole), "req-whole.1");
    let generation1 = whole.json()["kernel"]["generation"].as_u64().unwrap();

    // A streamed execute, its id made by the server.
    let code = json!({ "code": format!("print('{marker}'[:4])\nprint('two')") }).to_string();
    let streamed = send(
        &api,
        Method::POST,
        path,
        Some(&token),
        None,
        Some(&code),
        true,
    )
    .await;
    assert_eq!(streamed.status, StatusCode::OK);
    let streamed_id = request_id(&streamed);
    assert!(streamed.body.ends_with(b"\n"), "NDJSON read to its end");

    // A refusal (not a JSON object), with an id that is not sane: replaced.
    let insane = "has spaces \"and quotes\"";
    let refused = send(
        &api,
        Method::POST,
        path,
        Some(&token),
        Some(insane),
        Some("[1]"),
        false,
    )
    .await;
    assert_eq!(refused.error(StatusCode::BAD_REQUEST), "invalid_json");
    let refused_id = request_id(&refused);
    assert_ne!(refused_id, insane);

    // No token.
    let code = json!({ "code": format!("'{marker}'") }).to_string();
    let unauthorized = send(&api, Method::POST, path, None, None, Some(&code), false).await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    let unauthorized_id = request_id(&unauthorized);

    // A cell past its timeout: the kernel is killed, its state lost; the next call starts
    // generation 2; the session's removal ends it.
    let code = json!({ "code": "import time\ntime.sleep(60)", "timeout": 1 }).to_string();
    let timed_out = send(
        &api,
        Method::POST,
        path,
        Some(&token),
        None,
        Some(&code),
        false,
    )
    .await;
    assert_eq!(
        timed_out.json()["status"],
        "timeout",
        "{}",
        timed_out.json()
    );
    let again = api.run(&token, "logs-s1", "1").await;
    let generation2 = again["kernel"]["generation"].as_u64().unwrap();
    assert_eq!(generation2, generation1 + 1, "{again}");
    let cleared = send(
        &api,
        Method::DELETE,
        "/v1/sessions/logs-s1",
        Some(&token),
        None,
        None,
        false,
    )
    .await;
    assert!(cleared.status.is_success(), "{}", cleared.status);

    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    let lines = stderr.all().await;
    common::assert_clean(&engine, &label).await;

    // Every line is a JSON object; none holds the token or the cell's code.
    let events: Vec<Value> = lines
        .iter()
        .map(|line| {
            let event: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            assert!(event.is_object(), "{line}");
            assert!(
                event["timestamp"].is_string() && event["level"].is_string(),
                "{line}"
            );
            event
        })
        .collect();
    for line in &lines {
        assert!(!line.contains(&token), "the token is logged: {line}");
        assert!(!line.contains(&marker), "the cell's code is logged: {line}");
    }

    let route = "/v1/sessions/{session}/execute";
    let whole_line = access(&events, "req-whole.1");
    assert_eq!(whole_line["level"], "INFO", "{whole_line}");
    assert_eq!(whole_line["method"], "POST", "{whole_line}");
    assert_eq!(whole_line["route"], route, "{whole_line}");
    assert_eq!(whole_line["tenant"], "default", "{whole_line}");
    assert_eq!(whole_line["session"], "logs-s1", "{whole_line}");
    assert_eq!(whole_line["status"], 200, "{whole_line}");
    assert_eq!(whole_line["outcome"], "complete", "{whole_line}");
    assert!(
        whole_line["duration_ms"].as_f64().unwrap() > 0.0,
        "{whole_line}"
    );
    assert_eq!(
        whole_line["bytes_in"],
        json!({ "code": format!("secret = '{marker}'\nlen(secret)") })
            .to_string()
            .len(),
        "{whole_line}"
    );
    assert_eq!(whole_line["bytes_out"], whole.body.len(), "{whole_line}");

    let streamed_line = access(&events, &streamed_id);
    assert_eq!(streamed_line["route"], route, "{streamed_line}");
    assert_eq!(streamed_line["status"], 200, "{streamed_line}");
    assert_eq!(streamed_line["outcome"], "complete", "{streamed_line}");
    assert_eq!(
        streamed_line["bytes_out"],
        streamed.body.len(),
        "{streamed_line}"
    );

    let refused_line = access(&events, &refused_id);
    assert_eq!(refused_line["status"], 400, "{refused_line}");
    assert_eq!(refused_line["tenant"], "default", "{refused_line}");
    assert_eq!(refused_line["bytes_in"], 3, "{refused_line}");
    assert_eq!(
        refused_line["bytes_out"],
        refused.body.len(),
        "{refused_line}"
    );

    let unauthorized_line = access(&events, &unauthorized_id);
    assert_eq!(unauthorized_line["status"], 401, "{unauthorized_line}");
    assert_eq!(unauthorized_line["route"], route, "{unauthorized_line}");
    assert!(
        unauthorized_line.get("tenant").is_none(),
        "{unauthorized_line}"
    );

    // The kernel's life: started, lost to the timeout, started again, ended by the DELETE.
    let life = lifecycle(&events);
    let of_session: Vec<(&str, u64, &str)> = life
        .iter()
        .filter(|e| e["tenant"] == "default" && e["session"] == "logs-s1")
        .map(|e| {
            assert!(
                e["container"].as_str().is_some_and(|c| !c.is_empty()),
                "{e}"
            );
            (
                e["event"].as_str().unwrap(),
                e["generation"].as_u64().unwrap(),
                e["reason"].as_str().or(e["how"].as_str()).unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        of_session,
        vec![
            ("started", generation1, "cold"),
            ("lost", generation1, "timeout"),
            ("started", generation2, "cold"),
            ("ended", generation2, "cleared"),
        ],
        "{life:?}"
    );
    let container_of = |event: &str, generation: u64| {
        life.iter()
            .find(|e| e["event"] == event && e["generation"] == generation)
            .map(|e| e["container"].clone())
            .unwrap()
    };
    assert_eq!(
        container_of("started", generation1),
        container_of("lost", generation1)
    );
    assert_eq!(
        container_of("started", generation2),
        container_of("ended", generation2)
    );
}

/// Without `--log-format` the log stays text: the serving line as before, and the access log
/// in tracing's text format, one line per request.
#[tokio::test(flavor = "multi_thread")]
async fn text_stays_the_default_format() {
    let label = common::unique("logs-text");
    let state = tempfile::tempdir().expect("state dir");
    let (mut child, addr, stderr) =
        Stderr::serve(&label, "tok-logs-text", &["--pool", "0"], state.path()).await;
    let api = Api::new(addr);
    let reply = send(
        &api,
        Method::GET,
        "/v1/kernels",
        Some("tok-logs-text"),
        Some("text-1"),
        None,
        false,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    let lines = stderr.all().await;
    assert!(
        lines[0].starts_with("kernelbox: serving 1 tenant(s) on http://"),
        "{lines:?}"
    );
    let access: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("kernelbox::access") && l.contains("request_id=text-1"))
        .collect();
    assert_eq!(access.len(), 1, "{lines:?}");
    assert!(!access[0].starts_with('{'), "{}", access[0]);
    assert!(access[0].contains("route=\"/v1/kernels\""), "{}", access[0]);
    assert!(access[0].contains("status=200"), "{}", access[0]);
}
