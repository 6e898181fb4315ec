//! Connect RPC's plumbing for envd's services (`connect.rs`, `filesystem.rs`): errors, the
//! envelopes of a streamed call, a unary call's JSON body (docs/e2b.md, "Connect RPC").
//!
//! A unary call is a plain POST whose body is the message (`application/json`, or
//! `application/proto`), answered 200 with the message or with Connect's error body
//! (`{"code", "message"}`) and the HTTP status of its code. A streamed call's bodies are
//! envelopes: one flags byte, a big-endian u32 length, the message; the response's last one
//! is flagged end-of-stream and carries a JSON body (`{}` or `{"error": ...}`).

// A Connect error is the HTTP response itself, built once on the refusal path and answered
// as is: boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::InSandbox;
use crate::server::api;
use crate::server::{ApiError, AppState};

/// Connect's end-of-stream flag on an envelope.
pub(super) const END_STREAM: u8 = 0x02;

/// A Connect error answered before any stream: its JSON body with the HTTP status Connect
/// gives its code.
pub(super) fn error(code: &str, message: impl Into<String>) -> Response {
    let status = match code {
        "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        "permission_denied" => StatusCode::FORBIDDEN,
        "not_found" => StatusCode::NOT_FOUND,
        "already_exists" | "aborted" => StatusCode::CONFLICT,
        "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
        "unimplemented" => StatusCode::NOT_IMPLEMENTED,
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = serde_json::json!({"code": code, "message": message.into()});
    (status, Json(body)).into_response()
}

/// What kernelbox's envd does not provide, as Connect's `unimplemented`.
pub(super) fn unimplemented(what: &str) -> Response {
    error(
        "unimplemented",
        format!("{what} is not available on kernelbox's E2B API yet (docs/e2b.md, \"What is not there\")"),
    )
}

/// The Connect code of an [`ApiError`]'s status.
pub(super) fn code_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "invalid_argument",
        StatusCode::UNAUTHORIZED => "unauthenticated",
        StatusCode::FORBIDDEN => "permission_denied",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::CONFLICT => "failed_precondition",
        StatusCode::TOO_MANY_REQUESTS | StatusCode::INSUFFICIENT_STORAGE => "resource_exhausted",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        StatusCode::GATEWAY_TIMEOUT => "deadline_exceeded",
        StatusCode::NOT_IMPLEMENTED => "unimplemented",
        _ => "internal",
    }
}

/// An [`ApiError`] as a Connect error.
pub(super) fn from_api(e: ApiError) -> Response {
    error(code_of(e.status), format!("{}: {}", e.code, e.message))
}

/// One envelope: flags, length, message.
pub(super) fn envelope(flags: u8, message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// The end of a stream: `{}`, or the error that ended it.
pub(super) fn end_of_stream(error: Option<(&str, String)>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some((code, message)) => serde_json::json!({"error": {"code": code, "message": message}}),
    };
    envelope(END_STREAM, body.to_string().as_bytes())
}

/// The one message of a streaming request's body (a single envelope), or what is wrong.
pub(super) fn single_message(body: &[u8]) -> Result<&[u8], &'static str> {
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

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// A unary call's message, read (at most the API's body limit) and parsed from Connect's
/// JSON mapping; `application/proto` is refused as `unimplemented` (E2B's SDKs send JSON).
pub(super) async fn unary_request<T: DeserializeOwned>(
    state: &AppState,
    call: &InSandbox,
    headers: &HeaderMap,
    body: Body,
    what: &str,
) -> Result<T, Response> {
    let bytes = unary_body(state, call, headers, body).await?;
    parse(&bytes, what)
}

/// A unary call's body (JSON), read whole, at most the API's body limit.
pub(super) async fn unary_body(
    state: &AppState,
    call: &InSandbox,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, Response> {
    let kind = content_type(headers);
    if !kind.starts_with("application/json") {
        return Err(error(
            "unimplemented",
            format!("codec {kind:?}: kernelbox's envd takes this call as application/json"),
        ));
    }
    api::read_body_of(state, &call.tenant, headers, body)
        .await
        .map_err(from_api)
}

/// A unary call's message from its body (an empty body is the empty message).
pub(super) fn parse<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, Response> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| error("invalid_argument", format!("{what}: {e}")))
}

/// A streamed call's one message, read and parsed from Connect's JSON mapping
/// (`application/connect+json`).
pub(super) async fn stream_request<T: DeserializeOwned>(
    state: &AppState,
    call: &InSandbox,
    headers: &HeaderMap,
    body: Body,
    what: &str,
) -> Result<T, Response> {
    let kind = content_type(headers);
    if kind != "application/connect+json" {
        return Err(error(
            "unimplemented",
            format!("codec {kind:?}: kernelbox's envd takes this call as application/connect+json"),
        ));
    }
    let bytes = api::read_body_of(state, &call.tenant, headers, body)
        .await
        .map_err(from_api)?;
    let message = single_message(&bytes).map_err(|wrong| error("invalid_argument", wrong))?;
    serde_json::from_slice(message).map_err(|e| error("invalid_argument", format!("{what}: {e}")))
}

/// A unary call's answer: the message as JSON.
pub(super) fn unary_ok(message: impl Serialize) -> Response {
    Json(message).into_response()
}

/// A streamed response of `frames` (envelopes, the last one [`end_of_stream`]).
pub(super) fn stream_response(
    frames: impl futures::Stream<Item = Bytes> + Send + 'static,
) -> Response {
    use futures::StreamExt;
    let mut response = Response::new(Body::from_stream(
        frames.map(Ok::<_, std::convert::Infallible>),
    ));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    response
}

/// The deadline a client gave its call (`Connect-Timeout-Ms`).
pub(super) fn client_deadline(headers: &HeaderMap) -> Option<std::time::Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(std::time::Duration::from_millis)
}
