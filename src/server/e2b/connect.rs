//! envd's `process.Process` over Connect: Start, Connect, List, SendInput, StreamInput,
//! CloseStdin, SendSignal (no PTY: asking for one, and Update, are `unimplemented`). Every
//! command, foreground or background (E2B's SDK asks the same Start for both and only waits
//! or not), is a background process of the sandbox's session (`services/processes/`,
//! docs/processes.md), so it has a handle: its E2B pid is the process's id in its session (a
//! u32; ids count per session, so no tenant sees another's). A Start or a Connect streams
//! the process's output (what is kept, then live) and its end; the client going away, or its
//! deadline passing, ends the stream, not the process (as with E2B's envd: `kill` ends it).
//!
//! The messages are envd's (`spec/envd/process/process.proto` in e2b-dev/E2B), written as
//! `prost` messages by hand (the few this file needs; no build step, no `protoc`); E2B's
//! Python SDK sends Connect's JSON mapping of the same messages, which both codecs take for
//! Start and Connect, JSON only for the unary calls. The framing is `rpc.rs`'s. The Rust
//! Connect crates of crates.io were weighed (docs/e2b.md, "Connect RPC"): each needs code
//! generated from the .proto files with `protoc` at build time, and those that serve server
//! streams are marked pre-release; five bytes of framing did not justify either.
//!
//! Bounds: the processes service's (running processes per session, tenant and host, their
//! kept output, readers per process, a stdin write at most 1 MiB: docs/processes.md); a
//! request is at most the API's body limit, so a StreamInput's whole body is too; a stream
//! makes a frame only when its client reads, and lives at most its client's deadline or
//! [`MAX_STREAM_LIFE`].

// A Connect error is the HTTP response itself, built once on the refusal path and answered
// as is: boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::Response;
use base64::Engine as _;
use futures::StreamExt;
use prost::Message;
use serde::Deserialize;

use super::interpreter::HOME;
use super::rpc::{self, envelope, error, from_api, single_message, unary_ok, unimplemented};
use super::InSandbox;
use crate::kernel::CommandStream;
use crate::orchestrator::ProcessRequest;
use crate::owner::Owner;
use crate::server::api::{self, files};
use crate::server::{ApiError, AppState};
use crate::services::{Attach, OutputItem};

/// Longest life of a Start or Connect stream (the client's deadline when shorter).
pub(crate) const MAX_STREAM_LIFE: Duration = Duration::from_secs(24 * 3600);

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

/// envd's `process.ProcessSelector`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProcessSelector {
    #[prost(oneof = "SelectorKind", tags = "1, 2")]
    pub selector: Option<SelectorKind>,
}

/// The `selector` of a process selector.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum SelectorKind {
    #[prost(uint32, tag = "1")]
    Pid(u32),
    #[prost(string, tag = "2")]
    Tag(String),
}

/// envd's `process.ConnectRequest`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ConnectRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
}

/// envd's `process.StartResponse` (and `ConnectResponse`, the same message).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct StartResponse {
    #[prost(message, optional, tag = "1")]
    pub event: Option<ProcessEvent>,
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

/// `process.ProcessSelector` in Connect's JSON mapping (a pid; a tag is not kept here).
#[derive(Deserialize, Default)]
struct Selector {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Deserialize, Default)]
struct Selected {
    #[serde(default)]
    process: Option<Selector>,
}

#[derive(Deserialize, Default)]
struct Input {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Deserialize, Default)]
struct SendInput {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    input: Option<Input>,
}

#[derive(Deserialize, Default)]
struct SendSignal {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    signal: serde_json::Value,
}

/// One message of a StreamInput body: its start (the process), data, or a keepalive.
#[derive(Deserialize, Default)]
struct StreamInputMessage {
    #[serde(default)]
    start: Option<Selected>,
    #[serde(default)]
    data: Option<StreamInputData>,
}

#[derive(Deserialize, Default)]
struct StreamInputData {
    #[serde(default)]
    input: Option<Input>,
}

/// The pid a selector names, or the Connect error saying why not.
fn pid_of(selector: Option<Selector>) -> Result<u64, Response> {
    match selector {
        Some(Selector { pid: Some(pid), .. }) => Ok(u64::from(pid)),
        Some(Selector { tag: Some(_), .. }) => Err(unimplemented("selecting a process by tag")),
        _ => Err(error("invalid_argument", "no process selected (a pid)")),
    }
}

/// A process error as a Connect error (a process that is not there is `not_found`).
fn process_error(e: ApiError) -> Response {
    from_api(e)
}

/// The bytes of a JSON `bytes` field (base64).
fn input_bytes(input: Option<Input>) -> Result<Vec<u8>, Response> {
    let input = input.unwrap_or_default();
    if input.pty.is_some() {
        return Err(unimplemented("a PTY"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(input.stdin.unwrap_or_default())
        .map_err(|e| error("invalid_argument", format!("stdin is not base64: {e}")))
}

fn owner(state: &AppState, call: &InSandbox) -> Result<Owner, Response> {
    let scope = files::kernel_scope(&call.tenant, call.id.clone(), None);
    state
        .orchestrator()
        .owner_of_scope(&scope)
        .map_err(|e| from_api(e.into()))
}

fn codec_of(headers: &HeaderMap) -> Result<Codec, Response> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match content_type {
        "application/connect+proto" => Ok(Codec::Proto),
        "application/connect+json" => Ok(Codec::Json),
        other => Err(error(
            "unimplemented",
            format!(
                "codec {other:?}: kernelbox's envd streams application/connect+proto and +json"
            ),
        )),
    }
}

/// `POST /process.Process/{method}`.
pub(super) async fn process(
    State(state): State<AppState>,
    call: InSandbox,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if state.is_draining() {
        return from_api(ApiError::shutting_down());
    }
    let owner = match owner(&state, &call) {
        Ok(o) => o,
        Err(e) => return e,
    };
    let deadline = rpc::client_deadline(&headers)
        .filter(|d| !d.is_zero())
        .map_or(MAX_STREAM_LIFE, |d| d.min(MAX_STREAM_LIFE));
    let processes = state.orchestrator().processes();
    match method.as_str() {
        "Start" => start(&state, call, owner, &headers, body, deadline).await,
        "Connect" => {
            let codec = match codec_of(&headers) {
                Ok(c) => c,
                Err(e) => return e,
            };
            let bytes = match api::read_body_of(&state, &call.tenant, &headers, body).await {
                Ok(b) => b,
                Err(e) => return from_api(e),
            };
            let message = match single_message(&bytes) {
                Ok(m) => m,
                Err(wrong) => return error("invalid_argument", wrong),
            };
            let pid = match codec {
                Codec::Json => match serde_json::from_slice::<Selected>(message) {
                    Ok(asked) => pid_of(asked.process),
                    Err(e) => Err(error(
                        "invalid_argument",
                        format!("process.ConnectRequest: {e}"),
                    )),
                },
                Codec::Proto => match ConnectRequest::decode(message) {
                    Ok(ConnectRequest {
                        process:
                            Some(ProcessSelector {
                                selector: Some(SelectorKind::Pid(pid)),
                            }),
                    }) => Ok(u64::from(pid)),
                    Ok(_) => Err(error("invalid_argument", "no process selected (a pid)")),
                    Err(e) => Err(error(
                        "invalid_argument",
                        format!("process.ConnectRequest: {e}"),
                    )),
                },
            };
            let pid = match pid {
                Ok(p) => p,
                Err(e) => return e,
            };
            match processes.attach(&owner, pid) {
                Ok(attach) => stream(attach, pid, codec, deadline),
                Err(e) => process_error(e.into()),
            }
        }
        "List" => {
            if let Err(e) =
                rpc::unary_request::<serde_json::Value>(&state, &call, &headers, body, "List").await
            {
                return e;
            }
            let listed: Vec<serde_json::Value> = processes
                .list(&owner)
                .into_iter()
                .filter(|p| p.running)
                .filter_map(|p| {
                    let pid = u32::try_from(p.id).ok()?;
                    let mut argv = p.command.into_iter();
                    let cmd = argv.next().unwrap_or_default();
                    let mut config = serde_json::json!({
                        "cmd": cmd,
                        "args": argv.collect::<Vec<_>>(),
                        "envs": {},
                    });
                    if let Some(cwd) = p.cwd {
                        config["cwd"] = serde_json::Value::String(e2b_cwd(&cwd));
                    }
                    Some(serde_json::json!({"config": config, "pid": pid}))
                })
                .collect();
            unary_ok(serde_json::json!({"processes": listed}))
        }
        "SendInput" => {
            let asked: SendInput =
                match rpc::unary_request(&state, &call, &headers, body, "process.SendInputRequest")
                    .await
                {
                    Ok(a) => a,
                    Err(e) => return e,
                };
            let (pid, data) = match (pid_of(asked.process), input_bytes(asked.input)) {
                (Ok(pid), Ok(data)) => (pid, data),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            match processes.write_stdin(&owner, pid, &data).await {
                Ok(_) => unary_ok(serde_json::json!({})),
                Err(e) => process_error(e.into()),
            }
        }
        "StreamInput" => stream_input(&state, &call, &owner, &headers, body).await,
        "CloseStdin" => {
            let asked: Selected = match rpc::unary_request(
                &state,
                &call,
                &headers,
                body,
                "process.CloseStdinRequest",
            )
            .await
            {
                Ok(a) => a,
                Err(e) => return e,
            };
            let pid = match pid_of(asked.process) {
                Ok(p) => p,
                Err(e) => return e,
            };
            match processes.close_stdin(&owner, pid).await {
                Ok(_) => unary_ok(serde_json::json!({})),
                Err(e) => process_error(e.into()),
            }
        }
        "SendSignal" => {
            let asked: SendSignal = match rpc::unary_request(
                &state,
                &call,
                &headers,
                body,
                "process.SendSignalRequest",
            )
            .await
            {
                Ok(a) => a,
                Err(e) => return e,
            };
            let pid = match pid_of(asked.process) {
                Ok(p) => p,
                Err(e) => return e,
            };
            // envd's `Signal` enum: SIGKILL (9) and SIGTERM (15), by name or number.
            let signal = match &asked.signal {
                serde_json::Value::String(s) if s == "SIGNAL_SIGKILL" => 9,
                serde_json::Value::String(s) if s == "SIGNAL_SIGTERM" => 15,
                serde_json::Value::Number(n) if n.as_i64() == Some(9) => 9,
                serde_json::Value::Number(n) if n.as_i64() == Some(15) => 15,
                other => {
                    return error(
                        "invalid_argument",
                        format!("signal {other}: envd sends SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
                    )
                }
            };
            let done = if signal == 9 {
                processes.kill(&owner, pid).await
            } else {
                processes.signal(&owner, pid, signal).await
            };
            match done {
                Ok(_) => unary_ok(serde_json::json!({})),
                Err(e) => process_error(e.into()),
            }
        }
        "Update" => unimplemented("a PTY (process.Process/Update resizes one)"),
        other => unimplemented(&format!("process.Process/{other}")),
    }
}

/// A native working directory as E2B names it.
fn e2b_cwd(cwd: &str) -> String {
    if cwd.starts_with('/') {
        cwd.to_owned()
    } else {
        format!("{HOME}/{cwd}")
    }
}

/// StreamInput (a client stream): the body's envelopes, read whole (at most the API's body
/// limit), its start naming the process, its data written on its stdin in order.
async fn stream_input(
    state: &AppState,
    call: &InSandbox,
    owner: &Owner,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = codec_of(headers).and_then(|c| match c {
        Codec::Json => Ok(()),
        Codec::Proto => Err(unimplemented("StreamInput in protobuf")),
    }) {
        return e;
    }
    let bytes = match api::read_body_of(state, &call.tenant, headers, body).await {
        Ok(b) => b,
        Err(e) => return from_api(e),
    };
    let mut rest: &[u8] = &bytes;
    let mut pid = None;
    while !rest.is_empty() {
        let message = match single_message(rest) {
            Ok(m) => m,
            Err(wrong) => return error("invalid_argument", wrong),
        };
        let flags = rest[0];
        rest = &rest[5 + message.len()..];
        if flags & rpc::END_STREAM != 0 {
            break;
        }
        let message: StreamInputMessage = match serde_json::from_slice(message) {
            Ok(m) => m,
            Err(e) => {
                return error(
                    "invalid_argument",
                    format!("process.StreamInputRequest: {e}"),
                )
            }
        };
        if let Some(start) = message.start {
            pid = match pid_of(start.process) {
                Ok(p) => Some(p),
                Err(e) => return e,
            };
        }
        if let Some(data) = message.data {
            let Some(pid) = pid else {
                return error("invalid_argument", "data before the stream's start");
            };
            let data = match input_bytes(data.input) {
                Ok(d) => d,
                Err(e) => return e,
            };
            if let Err(e) = state
                .orchestrator()
                .processes()
                .write_stdin(owner, pid, &data)
                .await
            {
                return process_error(e.into());
            }
        }
    }
    rpc::stream_response(futures::stream::iter([
        envelope(0, b"{}"),
        rpc::end_of_stream(None),
    ]))
}

/// Start: the command as a background process of the session, then its output as a stream.
async fn start(
    state: &AppState,
    call: InSandbox,
    owner: Owner,
    headers: &HeaderMap,
    body: Body,
    deadline: Duration,
) -> Response {
    let codec = match codec_of(headers) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let bytes = match api::read_body_of(state, &call.tenant, headers, body).await {
        Ok(bytes) => bytes,
        Err(e) => return from_api(e),
    };
    let message = match single_message(&bytes) {
        Ok(m) => m,
        Err(wrong) => return error("invalid_argument", wrong),
    };
    let start = match codec.start_request(message) {
        Ok(start) => start,
        Err(e) => return error("invalid_argument", format!("process.StartRequest: {e}")),
    };
    if start.pty.is_some() {
        return unimplemented("a PTY");
    }
    let Some(config) = start.process else {
        return error("invalid_argument", "no process");
    };
    let request = ProcessRequest {
        scope: files::kernel_scope(&call.tenant, call.id, None),
        argv: std::iter::once(config.cmd).chain(config.args).collect(),
        cwd: command_cwd(config.cwd.as_deref()),
        env: config.envs.into_iter().collect(),
        stdin: start.stdin.unwrap_or(false),
    };
    if let Err(e) = api::admit(state, &call.tenant) {
        return from_api(e);
    }
    let info = match state.orchestrator().start_process(request).await {
        Ok(info) => info,
        Err(e) => return process_error(e.into()),
    };
    let Ok(_) = u32::try_from(info.id) else {
        return error(
            "resource_exhausted",
            "this sandbox started more processes than E2B's pids count",
        );
    };
    // E2B's start event is a process with a pid: it can be signalled once it is answered.
    if let Err(e) = state
        .orchestrator()
        .processes()
        .started(&owner, info.id)
        .await
    {
        return process_error(e.into());
    }
    match state.orchestrator().processes().attach(&owner, info.id) {
        Ok(attach) => stream(attach, info.id, codec, deadline),
        Err(e) => process_error(e.into()),
    }
}

/// A Start's or Connect's stream: the start event, the process's output, its end, then
/// Connect's end of stream; at `deadline` the stream ends (`deadline_exceeded`), the process
/// runs on. A frame is made only when the client reads one.
fn stream(attach: Attach, pid: u64, codec: Codec, deadline: Duration) -> Response {
    let pid = u32::try_from(pid).unwrap_or(u32::MAX);
    let first = codec.frame(Event::Start(StartEvent { pid }));
    let end = tokio::time::Instant::now() + deadline;
    let frames = futures::stream::unfold(Some(attach), move |attach| async move {
        let mut attach = attach?;
        let items = match tokio::time::timeout_at(end, attach.next()).await {
            Err(_) => {
                let message = "the call's deadline passed; the process runs on".to_owned();
                return Some((
                    vec![rpc::end_of_stream(Some(("deadline_exceeded", message)))],
                    None,
                ));
            }
            Ok(None) => {
                let message = "the process's output ended without its exit: its kernel went".to_owned();
                return Some((
                    vec![rpc::end_of_stream(Some(("unavailable", message)))],
                    None,
                ));
            }
            Ok(Some(items)) => items,
        };
        let mut frames = Vec::new();
        let mut ended = false;
        for item in items {
            match item {
                OutputItem::Chunk(CommandStream::Stdout, bytes) => {
                    frames.push(codec.frame(Event::Data(DataEvent {
                        output: Some(Output::Stdout(bytes.to_vec())),
                    })))
                }
                OutputItem::Chunk(CommandStream::Stderr, bytes) => {
                    frames.push(codec.frame(Event::Data(DataEvent {
                        output: Some(Output::Stderr(bytes.to_vec())),
                    })))
                }
                OutputItem::Missed(bytes) => {
                    let note = format!(
                        "[kernelbox: {bytes} bytes of output were dropped before they were read: a process keeps its newest 256 KiB]\n"
                    );
                    frames.push(codec.frame(Event::Data(DataEvent {
                        output: Some(Output::Stderr(note.into_bytes())),
                    })))
                }
                OutputItem::Exit(code) => {
                    let code = i32::try_from(code).unwrap_or(-1);
                    let status = if code > 128 {
                        format!("signal: {}", code - 128)
                    } else {
                        format!("exit status {code}")
                    };
                    frames.push(codec.frame(Event::End(EndEvent {
                        exit_code: code,
                        exited: code <= 128,
                        status,
                        error: None,
                    })));
                    frames.push(rpc::end_of_stream(None));
                    ended = true;
                }
            }
        }
        Some((frames, (!ended).then_some(attach)))
    })
    .flat_map(futures::stream::iter);
    let mut response = rpc::stream_response(futures::stream::iter([first]).chain(frames));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static(codec.content_type()),
    );
    response
}
