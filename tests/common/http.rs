//! A minimal harness for tests of the HTTP API: the real server (`kernelbox::server::serve`)
//! in-process on loopback ([`TestServer`]) or a real `kernelbox serve` process ([`Served`]),
//! against the real engine, with a small client ([`Api`]) and a session's files through it
//! ([`Session`], docs/files.md "Files in and out of a kernel"). Include it with
//! `#[path = "common/http.rs"] mod http;` next to `mod common;` (from a folder-style test such
//! as `tests/server/main.rs`: `#[path = "../common/mod.rs"]` and `#[path = "../common/http.rs"]`).
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper::{HeaderMap, Method, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use kernelbox::docker::Engine;
use kernelbox::server::{self, AppState, Tenants};
use kernelbox::{Config, Orchestrator};

use crate::common::{self, CASE};

/// A tenants file entry.
pub fn tenant(name: &str, token: &str) -> Value {
    json!({"name": name, "token_sha256": hex::encode(server::tenants::token_hash(token))})
}

/// A validated tenants set from entries.
pub fn tenants(entries: Vec<Value>) -> Tenants {
    let text = json!({ "tenants": entries }).to_string();
    Tenants::parse(&text, std::path::Path::new("test-tenants.json")).expect("valid tenants")
}

/// A response, read in full.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// Reads a response in full.
    pub async fn read(response: hyper::Response<Incoming>) -> Reply {
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("response body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{}: not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts the status and the `{"error": {"code", "message"}}` shape; returns the code.
    pub fn error(&self, status: StatusCode) -> String {
        let body = self.json();
        assert_eq!(self.status, status, "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
        body["error"]["code"]
            .as_str()
            .expect("error code")
            .to_string()
    }
}

/// NDJSON events of a streaming execute.
pub struct Events {
    body: Incoming,
    buf: Vec<u8>,
    ready: VecDeque<Value>,
}

impl Events {
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.ready.pop_front() {
                return Some(v);
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
    pub async fn until_output(&mut self, text: &str) {
        let mut seen = String::new();
        loop {
            let event = self.next().await.expect("stream ended before the output");
            assert_eq!(event["event"], "output", "{event}");
            seen.push_str(event["data"].as_str().expect("data"));
            if seen.contains(text) {
                return;
            }
        }
    }

    /// Reads to the result event (output events are skipped).
    pub async fn result(&mut self) -> Value {
        loop {
            let event = self.next().await.expect("stream ended without a result");
            match event["event"].as_str() {
                Some("output") => {}
                Some("result") => return event["result"].clone(),
                _ => panic!("unexpected event {event}"),
            }
        }
    }
}

/// An HTTP client aimed at one server.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: Client<HttpConnector, Full<Bytes>>,
}

impl Api {
    pub fn new(addr: SocketAddr) -> Api {
        Api {
            base: format!("http://{addr}"),
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// A request builder: `Authorization` when a token is given, `Content-Type: application/json`
    /// when a body will be, `Accept: application/x-ndjson` when `ndjson`.
    pub fn build(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        ndjson: bool,
        json_body: bool,
    ) -> hyper::http::request::Builder {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if json_body {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        if ndjson {
            req = req.header(ACCEPT, "application/x-ndjson");
        }
        req
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        ndjson: bool,
        body: Option<Bytes>,
    ) -> hyper::Request<Full<Bytes>> {
        self.build(method, path, token, ndjson, body.is_some())
            .body(Full::new(body.unwrap_or_default()))
            .expect("request")
    }

    /// Sends raw bytes (which need not be JSON); `None` sends no `Authorization` header.
    pub async fn send_bytes(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        ndjson: bool,
        body: Option<Bytes>,
    ) -> Reply {
        let req = self.request(method, path, token, ndjson, body);
        Reply::read(self.http.request(req).await.expect("HTTP request")).await
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        token: &str,
        ndjson: bool,
        body: Option<Value>,
    ) -> Reply {
        let body = body.map(|b| Bytes::from(b.to_string()));
        self.send_bytes(method, path, Some(token), ndjson, body)
            .await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Reply {
        self.send_bytes(Method::GET, path, token, false, None).await
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: Value) -> Reply {
        let body = Bytes::from(body.to_string());
        self.send_bytes(Method::POST, path, token, false, Some(body))
            .await
    }

    /// A GET with an `Accept` header (a directory as a tar archive: `application/x-tar`).
    pub async fn get_as(&self, path: &str, token: &str, accept: &str) -> Reply {
        let req = self
            .build(Method::GET, path, Some(token), false, false)
            .header(ACCEPT, accept)
            .body(Full::new(Bytes::new()))
            .expect("request");
        Reply::read(self.http.request(req).await.expect("GET")).await
    }

    /// A PUT of raw bytes (a file upload), with a `Content-Type` when one is given (a tar
    /// archive: `application/x-tar`).
    pub async fn put(
        &self,
        path: &str,
        token: &str,
        body: impl Into<Bytes>,
        content_type: Option<&str>,
    ) -> Reply {
        let mut req = self.build(Method::PUT, path, Some(token), false, false);
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        let req = req.body(Full::new(body.into())).expect("request");
        Reply::read(self.http.request(req).await.expect("PUT")).await
    }

    /// Starts a PUT of `path` whose body is what `body` yields, with no `Content-Length`; the
    /// task answers the reply, or the client's error.
    pub fn put_stream(
        &self,
        path: &str,
        token: &str,
        body: impl futures::Stream<Item = Chunk> + Send + Sync + 'static,
    ) -> Upload {
        let client =
            Client::builder(TokioExecutor::new()).build_http::<BoxBody<Bytes, std::io::Error>>();
        let req = self
            .build(Method::PUT, path, Some(token), false, false)
            .body(StreamBody::new(body).boxed())
            .expect("request");
        tokio::spawn(async move {
            match client.request(req).await {
                Ok(response) => Ok(Reply::read(response).await),
                Err(e) => Err(e),
            }
        })
    }

    pub async fn delete(&self, path: &str, token: &str) -> Reply {
        self.send(Method::DELETE, path, token, false, None).await
    }

    pub async fn execute(&self, token: &str, session: &str, body: Value) -> Reply {
        let path = format!("/v1/sessions/{session}/execute");
        self.send(Method::POST, &path, token, false, Some(body))
            .await
    }

    /// An execute asking for a stream, read in full (to see a refusal's status).
    pub async fn execute_ndjson(&self, token: &str, session: &str, body: Value) -> Reply {
        let path = format!("/v1/sessions/{session}/execute");
        self.send(Method::POST, &path, token, true, Some(body))
            .await
    }

    pub async fn interrupt(&self, token: &str, session: &str) -> Reply {
        let path = format!("/v1/sessions/{session}/interrupt");
        self.send(Method::POST, &path, token, false, Some(json!({})))
            .await
    }

    /// Runs a cell that must succeed; returns its result.
    pub async fn run(&self, token: &str, session: &str, code: &str) -> Value {
        let reply = self.execute(token, session, json!({ "code": code })).await;
        let result = reply.json();
        assert_eq!(reply.status, StatusCode::OK, "{result}");
        assert_eq!(result["status"], "success", "{result}");
        result
    }

    /// Starts a streaming command that must be admitted; returns its events.
    pub async fn stream_command(&self, token: &str, session: &str, body: Value) -> Events {
        self.stream_to(&format!("/v1/sessions/{session}/commands"), token, body)
            .await
    }

    /// Starts a streaming execute that must be admitted; returns its events.
    pub async fn stream(&self, token: &str, session: &str, body: Value) -> Events {
        self.stream_to(&format!("/v1/sessions/{session}/execute"), token, body)
            .await
    }

    async fn stream_to(&self, path: &str, token: &str, body: Value) -> Events {
        let path = path.to_string();
        let body = Bytes::from(body.to_string());
        let req = self.request(Method::POST, &path, Some(token), true, Some(body));
        let response = self.http.request(req).await.expect("HTTP request");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/x-ndjson");
        Events {
            body: response.into_body(),
            buf: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    /// The caller's tenant's kernels.
    pub async fn kernels(&self, token: &str) -> Vec<Value> {
        let reply = self.get("/v1/kernels", Some(token)).await;
        assert_eq!(reply.status, StatusCode::OK);
        reply.json()["kernels"].as_array().expect("kernels").clone()
    }

    /// The metrics text, asked for with a tenant's token (docs/http-api.md, "Metrics").
    pub async fn metrics(&self, token: &str) -> String {
        let reply = self.get("/metrics", Some(token)).await;
        assert_eq!(reply.status, StatusCode::OK);
        String::from_utf8_lossy(&reply.body).to_string()
    }
}

/// A server running in this process on 127.0.0.1:0.
pub struct TestServer {
    pub api: Api,
    pub label: String,
    pub engine: Arc<dyn Engine>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    /// Starts a server for `tenants` with the test config, tweaked.
    pub async fn start(
        name: &str,
        tenants: Tenants,
        tweak: impl FnOnce(&mut Config),
    ) -> TestServer {
        TestServer::start_with(name, tenants, tweak, |_| {}).await
    }

    /// [`TestServer::start`], with `prepare` given the server's state before it serves (to
    /// trace its requests, say).
    pub async fn start_with(
        name: &str,
        tenants: Tenants,
        tweak: impl FnOnce(&mut Config),
        prepare: impl FnOnce(&AppState),
    ) -> TestServer {
        let label = common::unique(name);
        let engine = common::engine().await;
        let mut config = Config::default();
        config.spec.sandbox.runtime = common::runtime();
        config.housekeeping.extra_labels = BTreeMap::from([(CASE.to_string(), label.clone())]);
        config.housekeeping.watchdog = Some(env!("CARGO_BIN_EXE_kernelbox").into());
        config.cells.timeout = Duration::from_secs(60);
        tweak(&mut config);
        let orchestrator = Orchestrator::start(config, engine.clone())
            .await
            .expect("orchestrator starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let state = AppState::new(orchestrator, tenants);
        prepare(&state);
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

    /// Short ids of this server's kernel containers of one tenant, as Docker sees them.
    pub async fn tenant_containers(&self, tenant: &str) -> Vec<String> {
        let mut ids: Vec<String> = common::containers(&self.engine, &self.label)
            .await
            .into_iter()
            .filter(|c| c.labels.get("io.kernelbox.tenant").map(String::as_str) == Some(tenant))
            .map(|c| c.id[..12].to_string())
            .collect();
        ids.sort();
        ids
    }

    /// Stops the server (the SIGTERM path) and asserts nothing of this case is left.
    pub async fn finish(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("server task")
            .expect("server ran cleanly");
        common::assert_clean(&self.engine, &self.label).await;
    }
}

/// The URL of `path` in the working directory of `session`'s kernel.
pub fn files(session: &str, path: &str) -> String {
    format!("/v1/sessions/{session}/files/{path}")
}

/// A chunk of a streamed request body; an error cuts the body.
pub type Chunk = Result<Frame<Bytes>, std::io::Error>;
/// A streamed PUT under way: the reply, or the client's error.
pub type Upload = tokio::task::JoinHandle<Result<Reply, hyper_util::client::legacy::Error>>;

/// One session of one tenant on a server: a test names it once, then speaks in paths inside
/// its kernel's working directory (a path may carry a query, e.g. `c.txt?child=helper`).
pub struct Session {
    pub api: Api,
    pub token: String,
    pub name: String,
}

impl Session {
    /// The session `name` of the tenant `token` names.
    pub fn new(api: &Api, token: &str, name: &str) -> Session {
        Session {
            api: api.clone(),
            token: token.to_string(),
            name: name.to_string(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        files(&self.name, path)
    }

    pub async fn put(&self, path: &str, body: impl Into<Vec<u8>>) -> Reply {
        self.api
            .put(&self.url(path), &self.token, body.into(), None)
            .await
    }

    /// Uploads a tar archive, extracted into the directory `path`.
    pub async fn put_tar(&self, path: &str, tar: Vec<u8>) -> Reply {
        let url = self.url(path);
        self.api
            .put(&url, &self.token, tar, Some("application/x-tar"))
            .await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.api.get(&self.url(path), Some(&self.token)).await
    }

    /// Uploads `data` to `path` and downloads it again: created, then the same bytes.
    pub async fn round_trip(&self, path: &str, data: &[u8]) {
        assert_eq!(
            self.put(path, data.to_vec()).await.status,
            StatusCode::CREATED
        );
        let reply = self.get(path).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body == data, "the bytes differ");
    }

    /// Downloads the directory `path` as a tar archive.
    pub async fn get_tar(&self, path: &str) -> Reply {
        let url = self.url(path);
        self.api
            .get_as(&url, &self.token, "application/x-tar")
            .await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.api.delete(&self.url(path), &self.token).await
    }

    /// Runs a cell that must succeed; returns its result.
    pub async fn run(&self, code: &str) -> Value {
        self.api.run(&self.token, &self.name, code).await
    }

    /// A PUT whose body is streamed (no `Content-Length`): `chunks` chunks of `size` bytes.
    pub async fn put_streamed(&self, path: &str, chunks: usize, size: usize) -> Reply {
        let chunk = Bytes::from(vec![b'z'; size]);
        let stream = futures::stream::iter(
            (0..chunks).map(move |_| Ok::<_, std::io::Error>(Frame::data(chunk.clone()))),
        );
        let upload = self.api.put_stream(&self.url(path), &self.token, stream);
        match upload.await.expect("the upload task") {
            Ok(reply) => reply,
            Err(e) => panic!("PUT failed: {e:?}"),
        }
    }

    /// Starts a PUT whose body the test paces: each chunk sent goes out when the server takes
    /// it; dropping the sender ends the body, sending an error cuts it.
    pub fn paced_put(&self, path: &str) -> (tokio::sync::mpsc::Sender<Chunk>, Upload) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(1);
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        (tx, self.api.put_stream(&self.url(path), &self.token, body))
    }

    /// Opens a connection with a tiny receive buffer, asks for `path` and reads no more than
    /// the first bytes of the answer.
    pub async fn stalled_get(&self, path: &str) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let addr: SocketAddr = self
            .api
            .base
            .trim_start_matches("http://")
            .parse()
            .expect("the server's address");
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("receive buffer");
        let mut stream = socket.connect(addr).await.expect("connect");
        let head = format!(
            "GET {} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\n\r\n",
            self.url(path),
            self.token
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        // The response has begun (the kernel is held) once its first bytes arrive.
        let mut first = [0u8; 1024];
        let n = tokio::io::AsyncReadExt::read(&mut stream, &mut first)
            .await
            .expect("read");
        assert!(
            first[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&first[..n])
        );
        stream
    }

    /// The id of the session's kernel container.
    pub async fn container(&self) -> String {
        self.api
            .kernels(&self.token)
            .await
            .into_iter()
            .find(|k| k["session"] == self.name.as_str())
            .and_then(|k| k["id"].as_str().map(str::to_string))
            .expect("the session's kernel")
    }
}

/// A real `kernelbox serve` process on a free port with one tenant (`token`), labelled as one
/// test's case.
pub struct Served {
    pub label: String,
    pub engine: Arc<dyn Engine>,
    pub process: tokio::process::Child,
    pub api: Api,
}

impl Served {
    /// Starts `kernelbox serve` with its own state directory and the `extra` flags.
    pub async fn start(name: &str, token: &str, extra: &[&str]) -> Served {
        use tokio::io::AsyncBufReadExt;
        let label = common::unique(name);
        let engine = common::engine().await;
        let state = tempfile::tempdir().expect("state directory");
        let mut process = common::serve_command(&label, token)
            .arg("--state-dir")
            .arg(state.path())
            .args(extra)
            .spawn()
            .expect("spawn kernelbox serve");
        let stderr = process.stderr.take().expect("stderr");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let addr = common::serving_addr(&mut lines).await;
        tokio::spawn(async move {
            let _state = state;
            while let Ok(Some(_)) = lines.next_line().await {}
        });
        Served {
            label,
            engine,
            process,
            api: Api::new(addr),
        }
    }

    /// Stops the process with SIGTERM, waits for it (at most 60 s) and asserts nothing of this
    /// case is left in Docker.
    pub async fn finish(mut self) {
        let status = common::terminate(&mut self.process, Duration::from_secs(60)).await;
        assert!(status.success(), "{status}");
        common::assert_clean(&self.engine, &self.label).await;
    }
}
