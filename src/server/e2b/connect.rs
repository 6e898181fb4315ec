//! envd's Connect RPC services, as much of them as kernelbox provides today:
//! `process.Process/Start` for a foreground command (no PTY, no stdin stream), run by the
//! orchestrator's command path (`POST /v1/sessions/{session}/commands`), its output streamed
//! as Connect frames. Every other method answers Connect's `unimplemented`.
//!
//! The messages are envd's (`spec/envd/process/process.proto` in e2b-dev/E2B), written as
//! `prost` messages by hand (the few this file needs; no build step, no `protoc`). The Connect
//! framing is written here too: a streaming response is a sequence of envelopes (one flags
//! byte, a big-endian u32 length, the message), the last one flagged end-of-stream with a JSON
//! body; an error before the stream is a JSON body with its HTTP status. The Rust Connect
//! crates of crates.io were weighed (docs/e2b.md, "Connect RPC"): each needs code generated
//! from the .proto files with `protoc` at build time, and those that serve server streams are
//! marked pre-release; five bytes of framing did not justify either.
//!
//! Bounds: the request is at most the API's body limit; the output waiting for the client is
//! at most [`MAX_BACKLOG`] bytes (more is dropped and said so on stderr, never queued), the
//! command's time is bounded by the orchestrator's command timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use prost::Message;

use super::interpreter::HOME;
use super::InSandbox;
use crate::kernel::CommandStream;
use crate::orchestrator::CommandRequest;
use crate::server::api::{self, files};
use crate::server::{ApiError, AppState};
use crate::wire::{CommandBody, CommandLine};

/// Output bytes of one command waiting for the client.
pub(crate) const MAX_BACKLOG: usize = 1024 * 1024;
/// Connect's end-of-stream flag on an envelope.
const END_STREAM: u8 = 0x02;
/// The pid every started process reports: commands have no pid kernelbox hands out.
const PID: u32 = 1;

/// envd's `process.ProcessConfig`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProcessConfig {
    #[prost(string, tag = "1")]
    pub cmd: String,
    #[prost(string, repeated, tag = "2")]
    pub args: Vec<String>,
    #[prost(map = "string, string", tag = "3")]
    pub envs: std::collections::HashMap<String, String>,
    #[prost(string, optional, tag = "4")]
    pub cwd: Option<String>,
}

/// envd's `process.PTY` (only whether one is asked for matters here).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Pty {}

/// envd's `process.StartRequest`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct StartRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessConfig>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
    #[prost(string, optional, tag = "3")]
    pub tag: Option<String>,
    #[prost(bool, optional, tag = "4")]
    pub stdin: Option<bool>,
}

/// envd's `process.ProcessEvent.StartEvent`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct StartEvent {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
}

/// envd's `process.ProcessEvent.DataEvent`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct DataEvent {
    #[prost(oneof = "Output", tags = "1, 2, 3")]
    pub output: Option<Output>,
}

/// The `output` of a data event.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Output {
    #[prost(bytes, tag = "1")]
    Stdout(Vec<u8>),
    #[prost(bytes, tag = "2")]
    Stderr(Vec<u8>),
    #[prost(bytes, tag = "3")]
    Pty(Vec<u8>),
}

/// envd's `process.ProcessEvent.EndEvent`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct EndEvent {
    #[prost(sint32, tag = "1")]
    pub exit_code: i32,
    #[prost(bool, tag = "2")]
    pub exited: bool,
    #[prost(string, tag = "3")]
    pub status: String,
    #[prost(string, optional, tag = "4")]
    pub error: Option<String>,
}

/// envd's `process.ProcessEvent`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProcessEvent {
    #[prost(oneof = "Event", tags = "1, 2, 3, 4")]
    pub event: Option<Event>,
}

/// The `event` of a process event.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Event {
    #[prost(message, tag = "1")]
    Start(StartEvent),
    #[prost(message, tag = "2")]
    Data(DataEvent),
    #[prost(message, tag = "3")]
    End(EndEvent),
    #[prost(message, tag = "4")]
    Keepalive(Pty),
}

/// envd's `process.StartResponse`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct StartResponse {
    #[prost(message, optional, tag = "1")]
    pub event: Option<ProcessEvent>,
}

/// A Connect error answered before any stream: its JSON body with the HTTP status Connect
/// gives its code.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"code": code, "message": message.into()});
    (status, Json(body)).into_response()
}

fn unimplemented(what: &str) -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        "unimplemented",
        format!("{what} is not available on kernelbox's E2B API yet (docs/e2b.md, \"What is not there\")"),
    )
}

/// An [`ApiError`] as a Connect error.
fn from_api(e: ApiError) -> Response {
    let code = match e.status {
        StatusCode::BAD_REQUEST => "invalid_argument",
        StatusCode::UNAUTHORIZED => "unauthenticated",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::TOO_MANY_REQUESTS => "resource_exhausted",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        _ => "internal",
    };
    error(e.status, code, format!("{}: {}", e.code, e.message))
}

/// One envelope: flags, length, message.
fn envelope(flags: u8, message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// The codec of a request, which its response speaks too: protobuf, or Connect's JSON
/// mapping of the same messages (which E2B's Python SDK sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Proto,
    Json,
}

/// `process.StartRequest` in Connect's JSON mapping (the fields this file reads).
#[derive(serde::Deserialize)]
struct StartRequestJson {
    #[serde(default)]
    process: Option<ProcessConfigJson>,
    #[serde(default)]
    pty: Option<serde_json::Value>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(serde::Deserialize)]
struct ProcessConfigJson {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: std::collections::HashMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

impl Codec {
    fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => "application/connect+proto",
            Codec::Json => "application/connect+json",
        }
    }

    fn start_request(self, message: &[u8]) -> Result<StartRequest, String> {
        match self {
            Codec::Proto => StartRequest::decode(message).map_err(|e| e.to_string()),
            Codec::Json => {
                let json: StartRequestJson =
                    serde_json::from_slice(message).map_err(|e| e.to_string())?;
                Ok(StartRequest {
                    process: json.process.map(|p| ProcessConfig {
                        cmd: p.cmd,
                        args: p.args,
                        envs: p.envs,
                        cwd: p.cwd,
                    }),
                    pty: json.pty.filter(|p| !p.is_null()).map(|_| Pty {}),
                    tag: None,
                    stdin: json.stdin,
                })
            }
        }
    }

    /// One `StartResponse` frame carrying `event`.
    fn frame(self, event: Event) -> Bytes {
        match self {
            Codec::Proto => {
                let response = StartResponse {
                    event: Some(ProcessEvent { event: Some(event) }),
                };
                envelope(0, &response.encode_to_vec())
            }
            Codec::Json => {
                use base64::Engine as _;
                let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
                let event = match event {
                    Event::Start(s) => serde_json::json!({"start": {"pid": s.pid}}),
                    Event::Data(DataEvent { output }) => match output {
                        Some(Output::Stdout(b)) => serde_json::json!({"data": {"stdout": b64(&b)}}),
                        Some(Output::Stderr(b)) => serde_json::json!({"data": {"stderr": b64(&b)}}),
                        Some(Output::Pty(b)) => serde_json::json!({"data": {"pty": b64(&b)}}),
                        None => serde_json::json!({"data": {}}),
                    },
                    Event::End(e) => {
                        let mut end = serde_json::json!({
                            "exitCode": e.exit_code,
                            "exited": e.exited,
                            "status": e.status,
                        });
                        if let Some(error) = e.error {
                            end["error"] = serde_json::Value::String(error);
                        }
                        serde_json::json!({"end": end})
                    }
                    Event::Keepalive(_) => serde_json::json!({"keepalive": {}}),
                };
                envelope(
                    0,
                    serde_json::json!({"event": event}).to_string().as_bytes(),
                )
            }
        }
    }
}

/// The one message of a streaming request's body (a single envelope), or what is wrong.
fn single_message(body: &[u8]) -> Result<&[u8], &'static str> {
    if body.len() < 5 {
        return Err("the request is not one Connect envelope");
    }
    if body[0] & 0x01 != 0 {
        return Err("compressed Connect messages are not accepted");
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    body.get(5..5 + len)
        .ok_or("the Connect envelope is shorter than its length")
}

/// An E2B working directory as the native command's (relative to `/work`, or absolute).
fn command_cwd(cwd: Option<&str>) -> Option<String> {
    let cwd = cwd.filter(|c| !c.is_empty())?;
    if cwd == HOME {
        return None;
    }
    match cwd.strip_prefix(HOME).and_then(|r| r.strip_prefix('/')) {
        Some(rest) => Some(rest.to_owned()),
        None => Some(cwd.to_owned()),
    }
}

/// `POST /process.Process/{method}` and `/filesystem.Filesystem/{method}`: `Start` runs a
/// foreground command; the rest is `unimplemented`.
pub(super) async fn process(
    State(state): State<AppState>,
    call: InSandbox,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if method != "Start" {
        return unimplemented(&format!("process.Process/{method}"));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let codec = match content_type {
        "application/connect+proto" => Codec::Proto,
        "application/connect+json" => Codec::Json,
        other => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unimplemented",
                format!(
                    "codec {other:?}: kernelbox's envd speaks application/connect+proto and +json"
                ),
            )
        }
    };
    let bytes = match api::read_body_of(&state, &call.tenant, &headers, body).await {
        Ok(bytes) => bytes,
        Err(e) => return from_api(e),
    };
    let message = match single_message(&bytes) {
        Ok(m) => m,
        Err(wrong) => return error(StatusCode::BAD_REQUEST, "invalid_argument", wrong),
    };
    let start = match codec.start_request(message) {
        Ok(start) => start,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                format!("process.StartRequest: {e}"),
            )
        }
    };
    if start.pty.is_some() {
        return unimplemented("a PTY");
    }
    if start.stdin == Some(true) {
        return unimplemented("stdin for a command");
    }
    let Some(config) = start.process else {
        return error(StatusCode::BAD_REQUEST, "invalid_argument", "no process");
    };
    // The SDK's deadline for the whole stream (its command `timeout`).
    let timeout = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|ms| serde_json::json!(ms as f64 / 1000.0));
    let body = CommandBody {
        command: CommandLine::Argv(std::iter::once(config.cmd).chain(config.args).collect()),
        cwd: command_cwd(config.cwd.as_deref()),
        env: config.envs.into_iter().collect(),
        stdin: None,
        timeout,
    };
    let scope = files::kernel_scope(&call.tenant, call.id, None);
    let request = match CommandRequest::from_body(scope, body, state.orchestrator().config()) {
        Ok(r) => r,
        Err(e) => return from_api(api::invalid(&state, e.into())),
    };
    if state.is_draining() {
        return from_api(ApiError::shutting_down());
    }
    if let Err(e) = api::admit(&state, &call.tenant) {
        return from_api(e);
    }
    stream(state, request, codec)
}

/// Frames queued for the client, bounded by [`MAX_BACKLOG`] (output beyond it is dropped).
struct Frames {
    tx: tokio::sync::mpsc::UnboundedSender<Bytes>,
    queued: Arc<AtomicUsize>,
    dropped: AtomicUsize,
}

impl Frames {
    fn output(&self, frame: Bytes) {
        let len = frame.len();
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + len <= MAX_BACKLOG).then_some(q + len)
            })
            .is_ok();
        if !admitted || self.tx.send(frame).is_err() {
            self.dropped.fetch_add(len, Ordering::AcqRel);
        }
    }

    fn last(&self, frame: Bytes) {
        self.queued.fetch_add(frame.len(), Ordering::AcqRel);
        let _ = self.tx.send(frame);
    }
}

/// Runs `request` to its end (whether or not the client still reads) and streams its events:
/// start, stdout and stderr data, end, then Connect's end of stream.
fn stream(state: AppState, mut request: CommandRequest, codec: Codec) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let queued = Arc::new(AtomicUsize::new(0));
    let frames = Arc::new(Frames {
        tx,
        queued: queued.clone(),
        dropped: AtomicUsize::new(0),
    });
    frames.last(codec.frame(Event::Start(StartEvent { pid: PID })));
    {
        let frames = frames.clone();
        request.sink = Some(Arc::new(move |stream: CommandStream, chunk: &[u8]| {
            let output = match stream {
                CommandStream::Stdout => Output::Stdout(chunk.to_vec()),
                CommandStream::Stderr => Output::Stderr(chunk.to_vec()),
            };
            frames.output(codec.frame(Event::Data(DataEvent {
                output: Some(output),
            })));
        }));
    }
    tokio::spawn(async move {
        let outcome = state.orchestrator().run_command(request).await;
        let dropped = frames.dropped.load(Ordering::Acquire);
        if dropped > 0 {
            let note = format!(
                "[kernelbox: {dropped} bytes of output were dropped: the client did not read them in time]\n"
            );
            frames.last(codec.frame(Event::Data(DataEvent {
                output: Some(Output::Stderr(note.into_bytes())),
            })));
        }
        let end = match outcome {
            Ok(result) => {
                let code = i32::try_from(result.exit_code).unwrap_or(-1);
                let status = if result.timed_out {
                    "killed: the command's timeout passed".to_owned()
                } else {
                    format!("exit status {code}")
                };
                let end = codec.frame(Event::End(EndEvent {
                    exit_code: code,
                    exited: !result.timed_out,
                    status,
                    error: result.timed_out.then(|| "timeout".to_owned()),
                }));
                frames.last(end);
                envelope(END_STREAM, b"{}")
            }
            Err(e) => {
                let e = ApiError::from(e);
                let body = serde_json::json!({"error": {
                    "code": "internal",
                    "message": format!("{}: {}", e.code, e.message),
                }});
                envelope(END_STREAM, body.to_string().as_bytes())
            }
        };
        frames.last(end);
    });
    let body = futures::stream::unfold(rx, move |mut rx| {
        let queued = queued.clone();
        async move {
            let frame = rx.recv().await?;
            queued.fetch_sub(frame.len(), Ordering::AcqRel);
            Some((Ok::<_, std::convert::Infallible>(frame), rx))
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(codec.content_type()),
    );
    response
}
