//! The HTTP API over real HTTP on loopback, against the real Docker engine: every endpoint and
//! status code, tenant isolation, streaming, interrupt, capacity, tool calls to a real tool
//! endpoint, and the `kernelbox serve` binary's SIGTERM cleanup and config errors.
//!
//! Each test labels what it creates with a unique `io.kernelbox-test.case` and ends by
//! asserting through the Docker API that nothing with that label is left.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{HeaderMap, Method, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use kernelbox::docker::Engine;
use kernelbox::server::{self, AppState, Tenants};
use kernelbox::{BollardEngine, Config, Orchestrator};

const CASE: &str = "io.kernelbox-test.case";

/// The exact error of an interrupted cell (README "The result of a cell").
const INTERRUPTED: &str = "Interrupted; the session kernel was killed and its state was lost.";

type Http = Client<HttpConnector, Full<Bytes>>;

fn unique(name: &str) -> String {
    format!(
        "srv-{name}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

async fn engine() -> Arc<dyn Engine> {
    let engine = BollardEngine::connect()
        .await
        .expect("the Docker engine must be running for integration tests");
    engine.ping().await.expect("the Docker engine must answer");
    Arc::new(engine)
}

/// Asserts nothing with the case label exists (removing leftovers so a failure stays local).
async fn assert_clean(engine: &Arc<dyn Engine>, label: &str) {
    let filter = [format!("{CASE}={label}")];
    let containers = engine
        .list_containers(&filter)
        .await
        .expect("list containers");
    let volumes = engine
        .list_volumes(&filter, false)
        .await
        .expect("list volumes");
    for c in &containers {
        let _ = engine.remove_container(&c.id).await;
    }
    for v in &volumes {
        let _ = kernelbox::kernel::remove_volume_when_free(engine.as_ref(), &v.name).await;
    }
    assert!(
        containers.is_empty(),
        "containers left behind: {containers:?}"
    );
    assert!(volumes.is_empty(), "volumes left behind: {volumes:?}");
}

/// A tenants file entry.
fn tenant(name: &str, token: &str) -> Value {
    json!({"name": name, "token_sha256": hex::encode(server::tenants::token_hash(token))})
}

fn tenants(entries: Vec<Value>) -> Tenants {
    let text = json!({ "tenants": entries }).to_string();
    Tenants::parse(&text, std::path::Path::new("test-tenants.json")).expect("valid tenants")
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{}: not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts the status and the `{"error": {"code", "message"}}` shape; returns the code.
    fn error(&self, status: StatusCode) -> String {
        let body = self.json();
        assert_eq!(self.status, status, "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
        body["error"]["code"]
            .as_str()
            .expect("error code")
            .to_string()
    }
}

/// NDJSON events of a streaming execute, each with the instant it arrived.
struct Events {
    body: Incoming,
    buf: Vec<u8>,
    ready: VecDeque<Value>,
}

impl Events {
    async fn next(&mut self) -> Option<(Value, Instant)> {
        loop {
            if let Some(v) = self.ready.pop_front() {
                return Some((v, Instant::now()));
            }
            let frame = self.body.frame().await?.expect("stream frame");
            let Ok(data) = frame.into_data() else {
                continue;
            };
            self.buf.extend_from_slice(&data);
            while let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                self.ready
                    .push_back(serde_json::from_slice(&line).expect("event is JSON"));
            }
        }
    }

    /// Reads until an output event contains `text`.
    async fn until_output(&mut self, text: &str) -> Instant {
        let mut seen = String::new();
        loop {
            let (event, at) = self.next().await.expect("stream ended before the output");
            assert_eq!(event["event"], "output", "{event}");
            seen.push_str(event["data"].as_str().expect("data"));
            if seen.contains(text) {
                return at;
            }
        }
    }

    /// Reads to the result event (output events are skipped).
    async fn result(&mut self) -> (Value, Instant) {
        loop {
            let (event, at) = self.next().await.expect("stream ended without a result");
            match event["event"].as_str() {
                Some("output") => {}
                Some("result") => return (event["result"].clone(), at),
                _ => panic!("unexpected event {event}"),
            }
        }
    }
}

/// An HTTP client aimed at one server.
#[derive(Clone)]
struct Api {
    base: String,
    http: Http,
}

impl Api {
    fn new(addr: SocketAddr) -> Api {
        Api {
            base: format!("http://{addr}"),
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    fn build(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Bytes>,
    ) -> hyper::http::request::Builder {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        req
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Bytes>,
    ) -> Reply {
        let req = self
            .build(method, path, token, body.clone())
            .body(Full::new(body.unwrap_or_default()))
            .expect("request");
        let response = self.http.request(req).await.expect("HTTP request");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("response body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> Reply {
        self.send(Method::GET, path, token, None).await
    }

    async fn delete(&self, path: &str, token: &str) -> Reply {
        self.send(Method::DELETE, path, Some(token), None).await
    }

    async fn post(&self, path: &str, token: Option<&str>, body: Value) -> Reply {
        self.send(
            Method::POST,
            path,
            token,
            Some(Bytes::from(body.to_string())),
        )
        .await
    }

    async fn execute(&self, token: &str, session: &str, body: Value) -> Reply {
        self.post(
            &format!("/v1/sessions/{session}/execute"),
            Some(token),
            body,
        )
        .await
    }

    /// Runs a cell that must succeed; returns its result.
    async fn run(&self, token: &str, session: &str, code: &str) -> Value {
        let reply = self.execute(token, session, json!({ "code": code })).await;
        let result = reply.json();
        assert_eq!(reply.status, StatusCode::OK, "{result}");
        assert_eq!(result["status"], "success", "{result}");
        result
    }

    /// Starts a streaming execute and returns its events.
    async fn stream(&self, token: &str, session: &str, body: Value) -> Events {
        let req = self
            .build(
                Method::POST,
                &format!("/v1/sessions/{session}/execute"),
                Some(token),
                Some(Bytes::new()),
            )
            .header(ACCEPT, "application/x-ndjson")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("request");
        let response = self.http.request(req).await.expect("HTTP request");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/x-ndjson");
        Events {
            body: response.into_body(),
            buf: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    async fn kernels(&self, token: &str) -> Vec<Value> {
        let reply = self.get("/v1/kernels", Some(token)).await;
        assert_eq!(reply.status, StatusCode::OK);
        reply.json()["kernels"].as_array().expect("kernels").clone()
    }
}

/// A server running in this process on 127.0.0.1:0.
struct TestServer {
    api: Api,
    label: String,
    engine: Arc<dyn Engine>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    async fn start(name: &str, tenants: Tenants) -> TestServer {
        let label = unique(name);
        let engine = engine().await;
        let config = Config {
            extra_labels: BTreeMap::from([(CASE.to_string(), label.clone())]),
            watchdog: Some(env!("CARGO_BIN_EXE_kernelbox").into()),
            cell_timeout: Duration::from_secs(60),
            ..Config::default()
        };
        let orchestrator = Orchestrator::start(config, engine.clone())
            .await
            .expect("orchestrator starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let state = AppState::new(orchestrator, tenants);
        let task = tokio::spawn(server::serve(
            listener,
            state,
            shutdown.clone(),
            Duration::from_secs(10),
        ));
        TestServer {
            api: Api::new(addr),
            label,
            engine,
            shutdown,
            task,
        }
    }

    /// Stops the server (the SIGTERM path) and asserts nothing of this case is left.
    async fn finish(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("server task")
            .expect("server ran cleanly");
        assert_clean(&self.engine, &self.label).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn execute_keeps_state_and_every_error_is_json_with_the_right_status() {
    let srv = TestServer::start("basic", tenants(vec![tenant("acme", "tok-a")])).await;
    let api = &srv.api;

    // Unauthenticated endpoints.
    let health = api.get("/healthz", None).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json()["status"], "ok");

    // 401 without a token, with a wrong one, with another scheme.
    let body = json!({"code": "1"});
    let r = api.post("/v1/sessions/s/execute", None, body.clone()).await;
    assert_eq!(r.error(StatusCode::UNAUTHORIZED), "unauthorized");
    let r = api
        .post("/v1/sessions/s/execute", Some("nope"), body.clone())
        .await;
    assert_eq!(r.error(StatusCode::UNAUTHORIZED), "unauthorized");
    let r = api.get("/v1/kernels", None).await;
    assert_eq!(r.error(StatusCode::UNAUTHORIZED), "unauthorized");
    assert!(r.headers.contains_key(hyper::header::WWW_AUTHENTICATE));

    // State persists across cells of a session.
    let first = api.run("tok-a", "s", "x = 41").await;
    assert_eq!(first["kernel"]["reused"], false);
    let second = api.run("tok-a", "s", "print(x + 1)").await;
    assert_eq!(second["output"], "42\n");
    assert_eq!(second["kernel"]["reused"], true);
    assert_eq!(second["kernel"]["execution_count"], 2);

    // A cell that raises is a 200 with status error.
    let r = api.execute("tok-a", "s", json!({"code": "1/0"})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["status"], "error");
    assert!(r.json()["error"]
        .as_str()
        .expect("traceback")
        .contains("ZeroDivisionError"));

    let kernels = api.kernels("tok-a").await;
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(kernels[0]["session"], "s");
    assert_eq!(kernels[0]["tenant"], "acme");

    // 400: names that would break labels or paths, bad JSON, bad fields, bad timeouts.
    let r = api.execute("tok-a", "a%20b", body.clone()).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");
    let r = api.execute("tok-a", "a::child::b", body.clone()).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");
    let r = api
        .execute("tok-a", "s", json!({"code": "1", "child": "../etc"}))
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");
    let r = api
        .send(
            Method::POST,
            "/v1/sessions/s/execute",
            Some("tok-a"),
            Some(Bytes::from_static(b"{\"code\": ")),
        )
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_json");
    for bad in [
        json!({}),
        json!({"code": 1}),
        json!({"code": "1", "colour": "red"}),
    ] {
        let r = api.execute("tok-a", "s", bad.clone()).await;
        assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_json", "{bad}");
    }
    for timeout in [json!(-1), json!(0), json!(1e9), json!("soon")] {
        let r = api
            .execute("tok-a", "s", json!({"code": "1", "timeout": timeout}))
            .await;
        assert_eq!(
            r.error(StatusCode::BAD_REQUEST),
            "invalid_timeout",
            "{timeout}"
        );
    }
    let r = api
        .execute("tok-a", "s", json!({"code": "1", "tools": ["web_search"]}))
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "tool_not_allowed");

    // 413 for a body over 1 MiB.
    let big = json!({ "code": format!("s = '{}'", "x".repeat(2 * 1024 * 1024)) });
    let r = api.execute("tok-a", "s", big).await;
    assert_eq!(r.error(StatusCode::PAYLOAD_TOO_LARGE), "payload_too_large");

    // 404 for unknown routes, 405 for a wrong method; both JSON.
    let r = api.get("/v1/nope", Some("tok-a")).await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api.get("/v1/sessions/s/execute", Some("tok-a")).await;
    assert_eq!(
        r.error(StatusCode::METHOD_NOT_ALLOWED),
        "method_not_allowed"
    );

    // Nothing running: interrupt is 404. Release of an unknown child is 404.
    let r = api
        .post("/v1/sessions/s/interrupt", Some("tok-a"), json!({}))
        .await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api.delete("/v1/sessions/s/children/c1", "tok-a").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api
        .delete("/v1/sessions/s/children/bad%2Fname", "tok-a")
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");

    // A delegated child gets its own kernel; releasing it disposes of it.
    let child = api
        .execute(
            "tok-a",
            "s",
            json!({"code": "print('x' in globals())", "child": "c1"}),
        )
        .await;
    assert_eq!(child.json()["output"], "False\n", "{}", child.json());
    assert_eq!(api.kernels("tok-a").await.len(), 2);
    let r = api.delete("/v1/sessions/s/children/c1", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["released"], 1);

    // Clear: the session's kernel goes; clearing again is 404; the next cell starts afresh.
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["cleared"], 1);
    assert!(api.kernels("tok-a").await.is_empty());
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let fresh = api.run("tok-a", "s", "print('x' in globals())").await;
    assert_eq!(fresh["output"], "False\n");

    // Metrics: Prometheus text, every label value present, counts moved.
    let m = api.get("/metrics", None).await;
    assert_eq!(m.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(m.headers[CONTENT_TYPE]
        .to_str()
        .expect("ct")
        .starts_with("text/plain"));
    assert!(text.contains("kernelbox_kernels_live 1"), "{text}");
    assert!(
        text.contains("kernelbox_cells_total{status=\"success\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_cells_total{status=\"error\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_cells_total{status=\"timeout\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_state_lost_total{reason=\"oom\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_tool_calls_total{outcome=\"ok\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_cell_duration_seconds_bucket{status=\"success\",le=\"+Inf\"} 4"),
        "{text}"
    );

    // The OpenAPI document describes every route the server answers, and the server answers
    // every route the document describes (no route is "unknown").
    let spec = api.get("/openapi.json", None).await;
    assert_eq!(spec.status, StatusCode::OK);
    let spec = spec.json();
    assert_eq!(spec["openapi"], "3.1.0");
    for (method, path) in server::ROUTES {
        assert!(
            spec["paths"][path][method.to_ascii_lowercase()].is_object(),
            "{method} {path} is not in /openapi.json"
        );
        let concrete = path.replace("{session}", "zz").replace("{child}", "cc");
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let r = api
            .send(
                method.clone(),
                &concrete,
                Some("tok-a"),
                Some(Bytes::from_static(b"{}")),
            )
            .await;
        if r.status == StatusCode::NOT_FOUND {
            assert_ne!(
                r.json()["error"]["message"]
                    .as_str()
                    .map(|m| m.starts_with("no route")),
                Some(true),
                "{method} {path}"
            );
        }
    }
    assert_eq!(
        spec["paths"].as_object().expect("paths").len(),
        server::ROUTES
            .iter()
            .map(|r| r.1)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );

    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_never_see_reach_or_clear_each_others_kernels() {
    let srv = TestServer::start(
        "isolation",
        tenants(vec![
            tenant("alpha", "tok-alpha"),
            tenant("beta", "tok-beta"),
        ]),
    )
    .await;
    let api = &srv.api;
    api.run("tok-alpha", "shared", "secret = 'alpha-only'")
        .await;

    // Beta sees nothing, and cannot clear, interrupt or release alpha's session.
    assert!(api.kernels("tok-beta").await.is_empty());
    let r = api.delete("/v1/sessions/shared", "tok-beta").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api
        .post("/v1/sessions/shared/interrupt", Some("tok-beta"), json!({}))
        .await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api
        .delete("/v1/sessions/shared/children/c", "tok-beta")
        .await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");

    // The same session name under beta is beta's own kernel.
    let b = api
        .run("tok-beta", "shared", "print(globals().get('secret'))")
        .await;
    assert_eq!(b["output"], "None\n");
    assert_eq!(b["kernel"]["reused"], false);

    // Alpha's state survived all of it, and each tenant lists only its own kernel.
    let a = api.run("tok-alpha", "shared", "print(secret)").await;
    assert_eq!(a["output"], "alpha-only\n");
    assert_eq!(a["kernel"]["reused"], true);
    let alpha = api.kernels("tok-alpha").await;
    let beta = api.kernels("tok-beta").await;
    assert_eq!(alpha.len(), 1);
    assert_eq!(beta.len(), 1);
    assert_eq!(alpha[0]["tenant"], "alpha");
    assert_eq!(beta[0]["tenant"], "beta");
    assert_ne!(alpha[0]["id"], beta[0]["id"]);

    // Beta clearing its own "shared" leaves alpha's alone.
    let r = api.delete("/v1/sessions/shared", "tok-beta").await;
    assert_eq!(r.json()["cleared"], 1);
    let a = api.run("tok-alpha", "shared", "print(secret)").await;
    assert_eq!(a["output"], "alpha-only\n");

    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_delivers_output_before_the_cell_ends() {
    let srv = TestServer::start("stream", tenants(vec![tenant("acme", "tok")])).await;
    let mut events = srv
        .api
        .stream(
            "tok",
            "s",
            json!({"code": "print('a', flush=True); import time; time.sleep(1); print('b')"}),
        )
        .await;
    let (first, first_at) = events.next().await.expect("an event");
    assert_eq!(first, json!({"event": "output", "data": "a\n"}));
    let mut output = String::from("a\n");
    let result = loop {
        let (event, at) = events.next().await.expect("more events");
        match event["event"].as_str() {
            Some("output") => output.push_str(event["data"].as_str().expect("data")),
            Some("result") => break (event["result"].clone(), at),
            _ => panic!("unexpected event {event}"),
        }
    };
    assert_eq!(output, "a\nb\n");
    assert_eq!(result.0["status"], "success");
    assert_eq!(result.0["output"], "a\nb\n");
    // 'a' arrived while the cell was still sleeping, not with the result.
    assert!(
        result.1.duration_since(first_at) >= Duration::from_millis(700),
        "output was not live: {:?}",
        result.1.duration_since(first_at)
    );
    assert!(
        events.next().await.is_none(),
        "the stream ends after the result"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_stops_a_running_cell_and_the_loss_is_reported() {
    let srv = TestServer::start("interrupt", tenants(vec![tenant("acme", "tok")])).await;
    let api = &srv.api;
    api.run("tok", "s", "x = 1").await;
    let mut events = api
        .stream(
            "tok",
            "s",
            json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(30)"}),
        )
        .await;
    let started = events.until_output("started").await;
    let r = api
        .post("/v1/sessions/s/interrupt", Some("tok"), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.json());
    assert_eq!(r.json()["interrupted"], 1);
    let (result, at) = events.result().await;
    assert_eq!(result["status"], "interrupted", "{result}");
    assert_eq!(result["error"], INTERRUPTED, "{result}");
    assert_eq!(result["exit_code"], -1);
    assert!(at.duration_since(started) < Duration::from_secs(20));

    // The kernel was killed: the next cell runs in a fresh one and is told why.
    let next = api.run("tok", "s", "print('x' in globals())").await;
    assert_eq!(next["output"], "False\n");
    assert_eq!(next["kernel"]["reused"], false);
    assert_eq!(next["kernel"]["state_lost"]["reason"], "killed", "{next}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_at_its_cap_gets_429_when_busy_and_evicts_when_idle() {
    let mut entry = tenant("small", "tok");
    entry["max_kernels"] = json!(1);
    let srv = TestServer::start("capacity", tenants(vec![entry])).await;
    let api = &srv.api;

    let mut busy = api
        .stream(
            "tok",
            "s1",
            json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(30)"}),
        )
        .await;
    busy.until_output("started").await;
    let r = api.execute("tok", "s2", json!({"code": "1"})).await;
    assert_eq!(r.error(StatusCode::TOO_MANY_REQUESTS), "at_capacity");
    assert_eq!(r.headers[RETRY_AFTER], "1");

    let r = api
        .post("/v1/sessions/s1/interrupt", Some("tok"), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let (result, _) = busy.result().await;
    assert_eq!(result["status"], "interrupted", "{result}");
    assert_eq!(result["error"], INTERRUPTED, "{result}");

    // Room again; and at the cap with an idle kernel, the idle one is evicted.
    api.run("tok", "s2", "y = 2").await;
    api.run("tok", "s3", "z = 3").await;
    let kernels = api.kernels("tok").await;
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(kernels[0]["session"], "s3");
    let m = api.get("/metrics", None).await;
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(
        text.contains("kernelbox_requests_rejected_total{reason=\"capacity\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_tenant_evictions_total 1"),
        "{text}"
    );
    srv.finish().await;
}

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
    let srv = TestServer::start("tools", tenants(vec![entry, tenant("other", "tok-other")])).await;
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

    let m = api.get("/metrics", None).await;
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

/// Reads the binary's stderr until the "serving" line; returns the address.
async fn serving_addr(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) -> SocketAddr {
    loop {
        let line = lines
            .next_line()
            .await
            .expect("stderr")
            .expect("the server exited before serving");
        if let Some(rest) = line.split("on http://").nth(1) {
            let addr = rest.split_whitespace().next().expect("address");
            return addr.parse().expect("socket address");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_running_cell_finish_then_removes_everything_and_exits_0() {
    let label = unique("sigterm");
    let engine = engine().await;
    let state = tempfile::tempdir().expect("state dir");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--label"])
        .arg(format!("{CASE}={label}"))
        .env("KERNELBOX_TOKEN", "tok-bin")
        .env("KERNELBOX_STATE_DIR", state.path())
        .env_remove("KERNELBOX_TENANTS")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = serving_addr(&mut lines).await;
    let api = Api::new(addr);
    api.run("tok-bin", "idle", "a = 1").await;
    let mut events = api
        .stream(
            "tok-bin",
            "s",
            json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(2)\nprint('done')"}),
        )
        .await;
    events.until_output("started").await;

    let pid = child.id().expect("pid").to_string();
    let kill = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(kill.success());

    // The running cell finishes (drain), then the process exits 0 with nothing left.
    let (result, _) = events.result().await;
    assert_eq!(result["status"], "success", "{result}");
    assert!(result["output"].as_str().expect("output").contains("done"));
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the server exits after SIGTERM")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
    assert_clean(&engine, &label).await;
}

#[tokio::test]
async fn bad_tenants_files_fail_with_exit_2_naming_the_file_and_field() {
    let dir = std::env::temp_dir().join(unique("tenants"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("tenants.json");
    std::fs::write(
        &bad,
        r#"{"tenants": [{"name": "acme", "token_sha256": "xyz"}]}"#,
    )
    .expect("write");
    let missing = dir.join("missing.json");
    for (file, field) in [(&bad, "tenants[0].token_sha256"), (&missing, "cannot read")] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args(["serve", "--listen", "127.0.0.1:0", "--tenants"])
            .arg(file)
            .output()
            .await
            .expect("run kernelbox serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains(field), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A random path segment: printable junk, percent-escapes (some invalid), long or empty.
fn junk_segment(rng: &mut rand::rngs::StdRng) -> String {
    use rand::Rng;
    const PIECES: &[&str] = &[
        "a", "Z", "0", ".", "..", "_", "-", "@", ":", "::", "%20", "%2F", "%00", "%ff", "%", "%zz",
        "%C3%A9", "é", "~", "'", "\"", "<", "{", "}", ";", "child", "\\", "+",
    ];
    match rng.random_range(0..10) {
        0 => String::new(),
        1 => "x".repeat(rng.random_range(100..300)),
        _ => (0..rng.random_range(1..8))
            .map(|_| PIECES[rng.random_range(0..PIECES.len())])
            .collect(),
    }
}

/// A random execute body that never names a runnable cell: either not a valid request at all,
/// or a `code` string with at least one invalid field next to it.
fn junk_body(rng: &mut rand::rngs::StdRng) -> Bytes {
    use rand::Rng;
    let weird = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1e308),
        json!(-0.0),
        json!("NaN"),
        json!(true),
        json!([]),
        json!({}),
        json!("x".repeat(300)),
        json!("a b"),
        json!("../.."),
        json!(["nope", 1]),
    ];
    let pick = |rng: &mut rand::rngs::StdRng| weird[rng.random_range(0..weird.len())].clone();
    match rng.random_range(0..6) {
        0 => Bytes::from(
            (0..rng.random_range(0..64))
                .map(|_| rng.random::<u8>())
                .collect::<Vec<u8>>(),
        ),
        1 => {
            let text = json!({"code": "pass", "timeout": 5}).to_string();
            let cut = rng.random_range(0..text.len());
            Bytes::from(text[..cut].to_string())
        }
        2 => Bytes::from(json!({"code": pick(rng), "reset": "maybe"}).to_string()),
        _ => {
            let mut body = json!({"code": "pass"});
            // One field certainly invalid, others random.
            let fields = ["timeout", "child", "tools", "task_id", "reset", "unknown"];
            let bad = fields[rng.random_range(0..fields.len())];
            body[bad] = match bad {
                "timeout" => json!(-1),
                "child" => json!("a b"),
                "tools" => json!(["not_allowed"]),
                "task_id" => json!("t".repeat(300)),
                "reset" => json!("yes"),
                _ => json!(1),
            };
            for field in fields {
                if field != bad && rng.random_bool(0.3) {
                    body[field] = pick(rng);
                }
            }
            Bytes::from(body.to_string())
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn random_requests_never_get_a_5xx_or_a_dropped_connection() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let srv = TestServer::start("fuzz", tenants(vec![tenant("acme", "tok")])).await;
    let methods = [
        Method::GET,
        Method::POST,
        Method::DELETE,
        Method::PUT,
        Method::PATCH,
    ];
    for i in 0..400 {
        let (method, template) = server::ROUTES[rng.random_range(0..server::ROUTES.len())];
        let mut method = Method::from_bytes(method.as_bytes()).expect("method");
        if rng.random_bool(0.1) {
            method = methods[rng.random_range(0..methods.len())].clone();
        }
        let mut path = template
            .replace("{session}", &junk_segment(&mut rng))
            .replace("{child}", &junk_segment(&mut rng));
        if rng.random_bool(0.05) {
            path = format!("/{}/{}", junk_segment(&mut rng), junk_segment(&mut rng));
        }
        // The path must stay a valid URI for the client to send it at all.
        if path.parse::<hyper::Uri>().is_err() {
            continue;
        }
        let token = match rng.random_range(0..10) {
            0 => None,
            1 => Some(junk_segment(&mut rng)),
            _ => Some("tok".to_string()),
        };
        let body = junk_body(&mut rng);
        let mut req = srv
            .api
            .build(method.clone(), &path, None, Some(body.clone()));
        if let Some(t) = &token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if rng.random_bool(0.3) {
            req = req.header(ACCEPT, "application/x-ndjson");
        }
        let req = req.body(Full::new(body.clone())).expect("request");
        let response = srv.api.http.request(req).await.unwrap_or_else(|e| {
            panic!("seed {seed}, request {i}: {method} {path}: connection failed: {e}")
        });
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert!(
            !status.is_server_error(),
            "seed {seed}, request {i}: {method} {path} {body:?} -> {status} {}",
            String::from_utf8_lossy(&bytes)
        );
        if status.is_client_error() {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!("seed {seed}: {method} {path} -> {status} without a JSON error body")
            });
            assert!(v["error"]["code"].is_string(), "seed {seed}: {v}");
        }
    }
    assert!(
        srv.api.kernels("tok").await.is_empty(),
        "no junk request ran a cell"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_client_that_does_not_read_loses_output_not_server_memory() {
    let srv = TestServer::start("stream-slow", tenants(vec![tenant("acme", "tok-a")])).await;
    let api = &srv.api;
    // 4 MB of output (under the result's 5 MB cap) that becomes ~24 MB of NDJSON: far more
    // than the server's stream backlog and the loopback socket buffers together.
    let code =
        "import sys\nsys.stdout.write('\\x01' * 4_000_000)\nsys.stdout.flush()\nprint('END')";
    let mut events = api.stream("tok-a", "s", json!({ "code": code })).await;
    // The client reads nothing until the cell is over; the cell never waits for it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let kernels = api.kernels("tok-a").await;
        if kernels
            .iter()
            .any(|k| k["session"] == "s" && k["attached"] == 0 && k["execution_count"] == 1)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cell did not finish: {kernels:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut streamed, mut dropped, mut result) = (0usize, 0usize, None);
    while let Some((event, _)) = events.next().await {
        match event["event"].as_str() {
            Some("output") => streamed += event["data"].as_str().expect("data").len(),
            Some("output_truncated") => dropped += event["bytes"].as_u64().expect("bytes") as usize,
            Some("result") => result = Some(event["result"].clone()),
            _ => panic!("unexpected event {event}"),
        }
    }
    let result = result.expect("the result arrives after the dropped output");
    assert_eq!(result["status"], "success", "{result}");
    assert!(
        dropped > 0,
        "output was dropped, not buffered ({streamed} streamed)"
    );
    assert_eq!(
        streamed + dropped,
        4_000_004,
        "every byte is streamed or counted"
    );
    srv.finish().await;
}
